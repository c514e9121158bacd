//! Replicated models on PostgreSQL: rows written together with their outboxes, one statement
//! per table, and read back by the relay at delivery.
//!
//! The models travel to the database as one JSON array parameter, which
//! `json_populate_recordset` turns into rows of the table's own type, so PostgreSQL converts
//! each value to its column's type.

use outbox_core::{
    BoxFuture, Error, IntoModelBatch, Message, MessageId, ModelBatch, ModelTable, ReplicatedModel,
};
use sqlx::{AssertSqlSafe, PgConnection, PgExecutor, Postgres, Transaction};

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

fn columns(table: &ModelTable, prefix: &str) -> String {
    table
        .columns
        .iter()
        .map(|column| format!("{prefix}{}", quoted(column)))
        .collect::<Vec<_>>()
        .join(", ")
}

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
        columns(table, ""),
        columns(table, "s."),
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
        columns(table, ""),
        quoted(table.table),
        quoted(table.key),
    )
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
    for<'c> &'c mut C: PgExecutor<'c>,
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
    let query = sqlx::query(AssertSqlSafe(sql));
    let query = match write {
        Write::Delete => query.bind(batch.keys()),
        Write::Insert | Write::Update | Write::Save => query.bind(batch.rows_json()?),
    };
    let rows = query
        .execute(&mut *conn)
        .await
        .map_err(on_table(operation))?
        .rows_affected();
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
    tx: &'t mut Transaction<'_, Postgres>,
    write: Write,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    let batch = models.into_batch();
    Box::pin(async move {
        let written = apply::<M, PgConnection>(&mut **tx, write, &batch).await?;
        Ok(written.rows)
    })
}

/// Inserts new models and writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Returns the rows inserted. Fails, writing
/// nothing, if a key exists already.
pub fn insert<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Insert, models)
}

/// Updates existing models (matched by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows updated; a
/// model without a row still gets its outbox, delivered as a deletion.
pub fn update<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Update, models)
}

/// Inserts or updates models (by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows written.
/// A key may appear only once in one call.
pub fn save<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    boxed(tx, Write::Save, models)
}

/// Deletes the models' rows, then writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Each outbox carries the model's tombstone, for
/// the deletion handler. Returns the rows deleted.
pub fn delete<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
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
            let mut counting = CountingExecutor::<PgConnection>::new(&mut tx);
            let written =
                apply::<Project, CountingExecutor<'_, PgConnection>>(&mut counting, write, &batch)
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
