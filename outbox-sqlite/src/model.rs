//! Replicated models on SQLite: rows written together with their outboxes, one statement per
//! table, and read back by the relay at delivery.
//!
//! The models travel to the database as one JSON array parameter, as the outbox rows do:
//! `json_each` turns it into rows, `->>` into column values.

use outbox_core::{
    BoxFuture, Error, IntoModelBatch, Message, MessageId, ModelBatch, ModelTable, ReplicatedModel,
};
use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection, SqliteExecutor, Transaction};

use crate::error::on_table;
use crate::write::write_all;

/// An identifier (`projects`, or `app.projects`), quoted.
fn quoted(identifier: &str) -> String {
    identifier
        .split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// `value ->> 'column'` for each column, from the `json_each` row `source`.
fn values(table: &ModelTable, source: &str) -> Vec<String> {
    table
        .columns
        .iter()
        .map(|column| format!("{source}.value ->> '{column}'"))
        .collect()
}

fn column_list(table: &ModelTable) -> String {
    table
        .columns
        .iter()
        .map(|column| quoted(column))
        .collect::<Vec<_>>()
        .join(", ")
}

fn insert_sql(table: &ModelTable) -> String {
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM json_each(?1) AS s WHERE true ORDER BY s.key",
        quoted(table.table),
        column_list(table),
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

async fn execute<'e>(
    executor: impl SqliteExecutor<'e>,
    sql: String,
    parameter: String,
    operation: &'static str,
) -> Result<u64, Error> {
    let done = sqlx::query(AssertSqlSafe(sql))
        .bind(parameter)
        .execute(executor)
        .await
        .map_err(on_table(operation))?;
    Ok(done.rows_affected())
}

/// One of the model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    Insert,
    Update,
    Save,
    Delete,
}

/// What a model write did.
#[derive(Debug)]
pub(crate) struct Written {
    /// Rows of the model's table affected.
    pub(crate) rows: u64,
    /// The outbox messages written.
    pub(crate) messages: Vec<Message>,
    /// Their ids.
    pub(crate) ids: Vec<MessageId>,
}

/// Applies `write` to `batch`: the rows and one outbox per model (and destination), two
/// statements, the rows first.
///
/// The outboxes are written after the change they announce, deletions included: the change
/// takes the rows' locks, so a second writer of the same object waits for the first to commit
/// before it writes its own outbox, and the outbox ids of one object follow the order in which
/// its writers commit. Written first, a deletion's outbox would take its id before waiting on
/// the lock of a writer that then commits ahead of it: the older id would carry the newer
/// change. (The relay does not rely on it: it acknowledges only the rows it read, S13.)
pub(crate) async fn apply<M, C>(
    conn: &mut C,
    write: Write,
    batch: &ModelBatch<'_, M>,
) -> Result<Written, Error>
where
    M: ReplicatedModel,
    for<'c> &'c mut C: SqliteExecutor<'c>,
{
    if batch.models().is_empty() {
        return Ok(Written {
            rows: 0,
            messages: Vec::new(),
            ids: Vec::new(),
        });
    }
    let messages = batch.messages()?;
    let (sql, operation) = match write {
        Write::Insert => (insert_sql(&M::TABLE), "inserting models"),
        Write::Update => (update_sql(&M::TABLE), "updating models"),
        Write::Save => (save_sql(&M::TABLE), "saving models"),
        Write::Delete => (delete_sql(&M::TABLE), "deleting models"),
    };
    let parameter = match write {
        Write::Delete => serde_json::Value::from(batch.keys()).to_string(),
        Write::Insert | Write::Update | Write::Save => batch.rows_json()?,
    };
    let rows = execute(&mut *conn, sql, parameter, operation).await?;
    let ids = write_all(&mut *conn, &messages).await?;
    Ok(Written {
        rows,
        messages,
        ids,
    })
}

/// `write` on the caller's transaction, the models converted at the call (so that a mistake
/// there is one error).
fn boxed<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    write: Write,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    let batch = models.into_batch();
    Box::pin(async move {
        let written = apply::<M, SqliteConnection>(&mut **tx, write, &batch).await?;
        Ok(written.rows)
    })
}

/// Inserts new models and writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Returns the rows inserted. Fails, writing
/// nothing, if a key exists already.
pub fn insert<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Insert, models)
}

/// Updates existing models (matched by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows updated; a
/// model without a row still gets its outbox, delivered as a deletion.
pub fn update<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Update, models)
}

/// Inserts or updates models (by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows written.
pub fn save<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Save, models)
}

/// Deletes the models' rows, then writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Each outbox carries the model's tombstone, for
/// the deletion handler. Returns the rows deleted.
pub fn delete<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Sqlite>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Delete, models)
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
            let mut counting = CountingExecutor::<SqliteConnection>::new(&mut tx);
            let written = apply::<Project, CountingExecutor<'_, SqliteConnection>>(
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
