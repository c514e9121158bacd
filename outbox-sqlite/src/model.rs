//! Replicated models on SQLite: the statements that write them and read them back.
//!
//! The models travel to the database as one JSON array parameter, as the outbox rows do:
//! `json_each` turns it into rows, `->>` into column values.

use outbox_core::{BoxFuture, Error, IntoModelBatch, ModelTable, ReplicatedModel};
use outbox_sqlx::Write;
use outbox_sqlx::model::{boxed, column_list, quoted};
use sqlx::{Sqlite, Transaction};

use crate::dialect::SqliteDialect;

/// `value ->> 'column'` for each column, from the `json_each` row `source`.
fn values(table: &ModelTable, source: &str) -> Vec<String> {
    table
        .columns
        .iter()
        .map(|column| format!("{source}.value ->> '{column}'"))
        .collect()
}

fn insert_sql(table: &ModelTable) -> String {
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM json_each(?1) AS s WHERE true ORDER BY s.key",
        quoted(table.table),
        column_list(table, ""),
        values(table, "s").join(", "),
    )
}

fn save_sql(table: &ModelTable) -> String {
    let set: Vec<String> = table
        .updated_columns()
        .iter()
        .map(|column| format!("{0} = excluded.{0}", quoted(column)))
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
        .map(|column| format!("{} = s.value ->> '{column}'", quoted(column)))
        .collect();
    format!(
        "UPDATE {} SET {} FROM json_each(?1) AS s WHERE {}.{} = s.value ->> '{}'",
        quoted(table.table),
        set.join(", "),
        quoted(table.table),
        quoted(table.key),
        table.key,
    )
}

fn delete_sql(table: &ModelTable) -> String {
    format!(
        "DELETE FROM {} WHERE {} IN (SELECT value FROM json_each(?1))",
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement the relay reads an object with: its columns as one JSON object.
pub(crate) fn load_sql(table: &ModelTable) -> String {
    let fields: Vec<String> = table
        .columns
        .iter()
        .map(|column| format!("'{column}', {}", quoted(column)))
        .collect();
    format!(
        "SELECT json_object({}) FROM {} WHERE {} = ?1",
        fields.join(", "),
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
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<SqliteDialect, M>(tx, Write::Insert, models)
}

/// Updates existing models (matched by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows updated; a
/// model without a row still gets its outbox, delivered as a deletion. A key may appear only
/// once in one call ([`Error::DuplicateKey`]).
pub fn update<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<SqliteDialect, M>(tx, Write::Update, models)
}

/// Inserts or updates models (by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows written.
/// A key may appear only once in one call ([`Error::DuplicateKey`]).
pub fn save<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<SqliteDialect, M>(tx, Write::Save, models)
}

/// Deletes the models' rows, then writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Each outbox carries the model's tombstone, for
/// the deletion handler. Returns the rows deleted. A key may appear only once in one call
/// ([`Error::DuplicateKey`]).
pub fn delete<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed::<SqliteDialect, M>(tx, Write::Delete, models)
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

    #[test]
    fn statements_quote_identifiers_and_read_json() {
        assert_eq!(
            save_sql(&TABLE),
            "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
             SELECT s.value ->> 'id', s.value ->> 'organization_id', s.value ->> 'name' \
             FROM json_each(?1) AS s WHERE true ORDER BY s.key \
             ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = excluded.\"organization_id\", \
             \"name\" = excluded.\"name\""
        );
        assert_eq!(
            load_sql(&TABLE),
            "SELECT json_object('id', \"id\", 'organization_id', \"organization_id\", 'name', \
             \"name\") FROM \"app\".\"projects\" WHERE \"id\" = ?1"
        );
    }

    /// One statement for the table, one for the outbox, however many models.
    #[tokio::test]
    async fn bulk_writes_are_one_statement_per_table() {
        use outbox_core::ModelBatch;
        use outbox_testkit::counting::CountingExecutor;
        use outbox_testkit::fixtures::{MODEL_TABLES, Project};
        use outbox_testkit::sqlite::SqliteTestDatabase;

        let database = SqliteTestDatabase::create().await;
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
            let written = outbox_sqlx::model::apply::<SqliteDialect, Project, _>(
                &mut counting,
                write,
                &batch,
            )
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
    fn a_key_only_table_updates_its_key() {
        let table = ModelTable {
            columns: &["id"],
            ..TABLE
        };
        assert!(save_sql(&table).ends_with("DO UPDATE SET \"id\" = excluded.\"id\""));
    }
}
