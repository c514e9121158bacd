//! Replicated models on PostgreSQL: rows written together with their outboxes, one statement
//! per table, and read back by the relay at delivery.
//!
//! The models travel to the database as one JSON array parameter, which
//! `json_populate_recordset` turns into rows of the table's own type, so PostgreSQL converts
//! each value to its column's type.

use outbox_core::{BoxFuture, Error, IntoModelBatch, ModelBatch, ModelTable, ReplicatedModel};
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

/// Writes the rows with `sql`, then one outbox per model (and destination).
async fn write_rows<M, C>(
    conn: &mut C,
    batch: &ModelBatch<'_, M>,
    sql: String,
    operation: &'static str,
) -> Result<u64, Error>
where
    M: ReplicatedModel,
    for<'c> &'c mut C: PgExecutor<'c>,
{
    if batch.models().is_empty() {
        return Ok(0);
    }
    let messages = batch.messages()?;
    let done = sqlx::query(AssertSqlSafe(sql))
        .bind(batch.rows_json()?)
        .execute(&mut *conn)
        .await
        .map_err(on_table(operation))?;
    write_all(&mut *conn, &messages).await?;
    Ok(done.rows_affected())
}

/// Writes the outboxes (with the tombstones), then deletes the rows.
async fn delete_rows<M, C>(conn: &mut C, batch: &ModelBatch<'_, M>) -> Result<u64, Error>
where
    M: ReplicatedModel,
    for<'c> &'c mut C: PgExecutor<'c>,
{
    if batch.models().is_empty() {
        return Ok(0);
    }
    write_all(&mut *conn, &batch.messages()?).await?;
    let done = sqlx::query(AssertSqlSafe(delete_sql(&M::TABLE)))
        .bind(batch.keys())
        .execute(&mut *conn)
        .await
        .map_err(on_table("deleting models"))?;
    Ok(done.rows_affected())
}

/// Inserts new models and writes their outboxes, in the caller's transaction: two
/// statements however many models there are. Returns the rows inserted. Fails, writing
/// nothing, if a key exists already.
pub fn insert<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    // The models are converted at the call, so that a mistake there is one error.
    let batch = models.into_batch();
    Box::pin(async move {
        write_rows::<M, PgConnection>(&mut **tx, &batch, insert_sql(&M::TABLE), "inserting models")
            .await
    })
}

/// Updates existing models (matched by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows updated; a
/// model without a row still gets its outbox, delivered as a deletion.
pub fn update<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    // The models are converted at the call, so that a mistake there is one error.
    let batch = models.into_batch();
    Box::pin(async move {
        write_rows::<M, PgConnection>(&mut **tx, &batch, update_sql(&M::TABLE), "updating models")
            .await
    })
}

/// Inserts or updates models (by key) and writes their outboxes, in the caller's
/// transaction: two statements however many models there are. Returns the rows written. A
/// key may appear only once in one call.
pub fn save<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    // The models are converted at the call, so that a mistake there is one error.
    let batch = models.into_batch();
    Box::pin(async move {
        write_rows::<M, PgConnection>(&mut **tx, &batch, save_sql(&M::TABLE), "saving models").await
    })
}

/// Writes the models' outboxes, then deletes their rows, in the caller's transaction: two
/// statements however many models there are. Each outbox carries the model's tombstone, for
/// the deletion handler. Returns the rows deleted.
pub fn delete<'t, 'a: 't, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, Postgres>,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    // The models are converted at the call, so that a mistake there is one error.
    let batch = models.into_batch();
    Box::pin(async move { delete_rows::<M, PgConnection>(&mut **tx, &batch).await })
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
        for (write, sql) in [
            ("insert", insert_sql(&Project::TABLE)),
            ("update", update_sql(&Project::TABLE)),
            ("save", save_sql(&Project::TABLE)),
        ] {
            let mut counting = CountingExecutor::<PgConnection>::new(&mut tx);
            let rows = write_rows::<Project, CountingExecutor<'_, PgConnection>>(
                &mut counting,
                &batch,
                sql,
                "writing",
            )
            .await
            .expect(write);
            assert_eq!((write, rows, counting.statements()), (write, 100, 2));
        }
        let mut counting = CountingExecutor::<PgConnection>::new(&mut tx);
        let rows =
            delete_rows::<Project, CountingExecutor<'_, PgConnection>>(&mut counting, &batch)
                .await
                .expect("delete");
        assert_eq!((rows, counting.statements()), (100, 2));
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
