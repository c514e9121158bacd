//! Replicated models: rows written together with their outboxes, one statement per table.

use std::collections::HashSet;

use outbox_core::{
    BoxFuture, Error, IntoModelBatch, Message, MessageId, ModelBatch, ModelTable, ReplicatedModel,
};
use sqlx::{AssertSqlSafe, Transaction};

use crate::dialect::Dialect;
use crate::error::on_table;
use crate::sql::{Runner, With};
use crate::write::write_all;

/// One of the model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// New rows; fails if a key exists.
    Insert,
    /// Existing rows, matched by key.
    Update,
    /// Inserted or updated, by key.
    Save,
    /// Deleted.
    Delete,
}

impl Write {
    fn operation(self) -> &'static str {
        match self {
            Write::Insert => "inserting models",
            Write::Update => "updating models",
            Write::Save => "saving models",
            Write::Delete => "deleting models",
        }
    }
}

/// An identifier (`projects`, or `app.projects`), quoted with double quotes (standard SQL,
/// and SQLite's).
pub fn quoted(identifier: &str) -> String {
    identifier
        .split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// The table's columns, quoted and each with `prefix`, separated by commas.
pub fn column_list(table: &ModelTable, prefix: &str) -> String {
    table
        .columns
        .iter()
        .map(|column| format!("{prefix}{}", quoted(column)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn insert_sql<D: Dialect>(table: &ModelTable) -> String {
    let values: Vec<String> = table.columns.iter().map(|c| D::model_value(c)).collect();
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM {} WHERE true",
        quoted(table.table),
        column_list(table, ""),
        values.join(", "),
        D::model_rows(table),
    )
}

/// The statement for `write` of `table`'s models, in `D`'s dialect.
pub fn model_sql<D: Dialect>(write: Write, table: &ModelTable) -> String {
    let table_name = quoted(table.table);
    let key = quoted(table.key);
    match write {
        Write::Insert => insert_sql::<D>(table),
        Write::Save => {
            let set: Vec<String> = table
                .updated_columns()
                .iter()
                .map(|column| format!("{0} = EXCLUDED.{0}", quoted(column)))
                .collect();
            format!(
                "{} ON CONFLICT ({key}) DO UPDATE SET {}",
                insert_sql::<D>(table),
                set.join(", "),
            )
        }
        Write::Update => {
            let set: Vec<String> = table
                .updated_columns()
                .iter()
                .map(|column| format!("{} = {}", quoted(column), D::model_value(column)))
                .collect();
            format!(
                "UPDATE {table_name} SET {} FROM {} WHERE {table_name}.{key} = {}",
                set.join(", "),
                D::model_rows(table),
                D::model_value(table.key),
            )
        }
        Write::Delete => format!("DELETE FROM {table_name} WHERE {}", D::key_in_list(&key)),
    }
}

/// What a model write did.
#[derive(Debug)]
pub struct Written {
    /// Rows of the model's table affected.
    pub rows: u64,
    /// The outbox messages written.
    pub messages: Vec<Message>,
    /// Their ids.
    pub ids: Vec<MessageId>,
}

/// Refuses a batch that names one key twice: one behaviour on every backend (a database would
/// otherwise refuse it, or keep one of the two rows, or update by either), and one outbox per
/// object and write.
fn distinct_keys<M: ReplicatedModel>(batch: &ModelBatch<'_, M>) -> Result<(), Error> {
    if batch.models().len() < 2 {
        return Ok(());
    }
    let mut seen = HashSet::with_capacity(batch.models().len());
    for model in batch.models() {
        let key = model.object_identifier();
        if !seen.insert(key) {
            return Err(Error::DuplicateKey {
                model: M::NAME,
                key,
            });
        }
    }
    Ok(())
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
pub async fn apply<D, M, R>(
    runner: &mut R,
    write: Write,
    batch: &ModelBatch<'_, M>,
) -> Result<Written, Error>
where
    D: Dialect,
    M: ReplicatedModel,
    R: Runner<Database = D::Database>,
{
    if batch.models().is_empty() {
        return Ok(Written {
            rows: 0,
            messages: Vec::new(),
            ids: Vec::new(),
        });
    }
    distinct_keys(batch)?;
    let messages = batch.messages()?;
    let query = sqlx::query(AssertSqlSafe(model_sql::<D>(write, &M::TABLE)));
    let query = match write {
        Write::Delete => D::bind_ids(query, batch.keys()),
        Write::Insert | Write::Update | Write::Save => query.with(batch.rows_json()?),
    };
    let done = query
        .execute(runner.executor())
        .await
        .map_err(on_table::<D>(write.operation()))?;
    let rows = D::rows_affected(&done);
    let ids = write_all::<D, _>(runner.executor(), &messages).await?;
    Ok(Written {
        rows,
        messages,
        ids,
    })
}

/// `write` on the caller's transaction, the models converted at the call (so that a mistake
/// there is one error).
pub fn boxed<'t, 'a: 't, D: Dialect, M: ReplicatedModel>(
    tx: &'t mut Transaction<'_, D::Database>,
    write: Write,
    models: impl IntoModelBatch<'a, M>,
) -> BoxFuture<'t, Result<u64, Error>> {
    let batch = models.into_batch();
    Box::pin(async move {
        let written = apply::<D, M, _>(tx, write, &batch).await?;
        Ok(written.rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_part_by_part() {
        assert_eq!(quoted("app.projects"), "\"app\".\"projects\"");
        assert_eq!(quoted("we\"ird"), "\"we\"\"ird\"");
        let table = ModelTable {
            table: "projects",
            key: "id",
            columns: &["id", "name"],
            bool_columns: &[],
        };
        assert_eq!(column_list(&table, "s."), "s.\"id\", s.\"name\"");
    }
}
