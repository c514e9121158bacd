//! Replicated models on PostgreSQL: the statements that write them and read them back.
//!
//! The models travel to the database as one JSON array parameter, which
//! `json_populate_recordset` turns into rows of the table's own type, so PostgreSQL converts
//! each value to its column's type.

use outbox_core::{BoxFuture, Error, IntoModelBatch, ModelTable, ReplicatedModel};
use outbox_sqlx::Write;
use outbox_sqlx::model::{boxed, column_list, quoted};
use sqlx::{Postgres, Transaction};

use crate::dialect::PgDialect;

/// The rows of parameter `$1`, typed as the table's rows.
fn rows(table: &ModelTable) -> String {
    format!(
        "json_populate_recordset(NULL::{}, $1::text::json)",
        quoted(table.table)
    )
}

fn insert_sql(table: &ModelTable) -> String {
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM {} AS s",
        quoted(table.table),
        column_list(table, ""),
        column_list(table, "s."),
        rows(table),
    )
}

fn save_sql(table: &ModelTable) -> String {
    let set: Vec<String> = table
        .updated_columns()
        .iter()
        .map(|column| format!("{0} = EXCLUDED.{0}", quoted(column)))
        .collect();
    format!(
        "{} ON CONFLICT ({}) DO UPDATE SET {}",
        insert_sql(table),
        quoted(table.key),
        set.join(", "),
    )
}

fn update_sql(table: &ModelTable) -> String {
    let set: Vec<String> = table
        .updated_columns()
        .iter()
        .map(|column| format!("{0} = s.{0}", quoted(column)))
        .collect();
    format!(
        "UPDATE {} AS m SET {} FROM {} AS s WHERE m.{key} = s.{key}",
        quoted(table.table),
        set.join(", "),
        rows(table),
        key = quoted(table.key),
    )
}

fn delete_sql(table: &ModelTable) -> String {
    format!(
        "DELETE FROM {} WHERE {} = ANY($1)",
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement the relay reads an object with: its columns as one JSON object.
pub(crate) fn load_sql(table: &ModelTable) -> String {
    format!(
        "SELECT to_json(s)::text FROM (SELECT {} FROM {} WHERE {} = $1) AS s",
        column_list(table, ""),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement for `write` of `table`'s models.
pub(crate) fn model_sql(write: Write, table: &ModelTable) -> String {
    match write {
        Write::Insert => insert_sql(table),
        Write::Update => update_sql(table),
        Write::Save => save_sql(table),
        Write::Delete => delete_sql(table),
    }
}

/// Inserts new models and writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Returns the rows inserted. Fails, writing
/// nothing, if a key exists already, or appears twice ([`Error::DuplicateKey`]).
pub fn insert<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<PgDialect, M>(tx, Write::Insert, models)
}

/// Updates existing models (matched by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows updated; a
/// model without a row still gets its outbox, delivered as a deletion. A key may appear only
/// once in one call ([`Error::DuplicateKey`]).
pub fn update<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<PgDialect, M>(tx, Write::Update, models)
}

/// Inserts or updates models (by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows written.
/// A key may appear only once in one call ([`Error::DuplicateKey`]).
pub fn save<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<PgDialect, M>(tx, Write::Save, models)
}

/// Deletes the models' rows, then writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Each outbox carries the model's tombstone, for
/// the deletion handler. Returns the rows deleted. A key may appear only once in one call
/// ([`Error::DuplicateKey`]).
pub fn delete<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<PgDialect, M>(tx, Write::Delete, models)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: ModelTable = ModelTable {
        table: "app.projects",
        key: "id",
        columns: &["id", "organization_id", "name"],
        bool_columns: &[],
    };

    /// One statement for the table, one for the outbox, however many models.
    #[tokio::test]
    async fn bulk_writes_are_one_statement_per_table() {
        use outbox_core::ModelBatch;
        use outbox_testkit::counting::CountingExecutor;
        use outbox_testkit::fixtures::{MODEL_TABLES, Project};
        use outbox_testkit::postgres::PgTestDatabase;

        let database = PgTestDatabase::create().await;
        crate::migrate(database.pool()).await.expect("migrate");
        sqlx::query(MODEL_TABLES[0])
            .execute(database.pool())
            .await
            .expect("create projects");
        let projects: Vec<_> = (1..=100).map(|id| Project::new(id, id % 7, "p")).collect();
        let batch = ModelBatch::local(&projects);
        let mut tx = database.pool().begin().await.expect("begin");
        for write in [Write::Insert, Write::Update, Write::Save, Write::Delete] {
            let mut counting = CountingExecutor::new(&mut tx);
            let written =
                outbox_sqlx::model::apply::<PgDialect, Project, _>(&mut counting, write, &batch)
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
        let outboxes: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
            .fetch_one(&mut *tx)
            .await
            .expect("count");
        assert_eq!(outboxes, 400, "one outbox per model and write");
    }

    #[test]
    fn statements_quote_identifiers_and_type_the_rows() {
        assert_eq!(
            save_sql(&TABLE),
            "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
             SELECT s.\"id\", s.\"organization_id\", s.\"name\" \
             FROM json_populate_recordset(NULL::\"app\".\"projects\", $1::text::json) AS s \
             ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = EXCLUDED.\"organization_id\", \
             \"name\" = EXCLUDED.\"name\""
        );
        assert_eq!(
            update_sql(&TABLE),
            "UPDATE \"app\".\"projects\" AS m SET \"organization_id\" = s.\"organization_id\", \
             \"name\" = s.\"name\" \
             FROM json_populate_recordset(NULL::\"app\".\"projects\", $1::text::json) AS s \
             WHERE m.\"id\" = s.\"id\""
        );
        assert_eq!(
            load_sql(&TABLE),
            "SELECT to_json(s)::text FROM (SELECT \"id\", \"organization_id\", \"name\" \
             FROM \"app\".\"projects\" WHERE \"id\" = $1) AS s"
        );
    }
}
