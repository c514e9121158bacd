//! The standard SQL of replicated models' writes: what a dialect's
//! [`Dialect::model_sql`](crate::Dialect::model_sql) and
//! [`Dialect::columns_sql`](crate::Dialect::columns_sql) answer unless the database speaks
//! otherwise.

use outbox_core::replicated::ModelTable;

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
    pub(crate) fn operation(self) -> &'static str {
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

/// The table's columns, quoted, separated by commas.
pub fn column_list(table: &ModelTable) -> String {
    table
        .columns
        .iter()
        .map(|column| quoted(column))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `rows` rows of `table`'s columns as parameters, numbered from 1 in row order:
/// `($1, $2), ($3, $4)`.
fn values(table: &ModelTable, rows: usize, placeholder: fn(usize) -> String) -> String {
    let width = table.columns.len();
    (0..rows)
        .map(|row| {
            let row: Vec<String> = (1..=width)
                .map(|column| placeholder(row * width + column))
                .collect();
            format!("({})", row.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn insert_sql(table: &ModelTable, rows: usize, placeholder: fn(usize) -> String) -> String {
    format!(
        "INSERT INTO {} ({}) VALUES {}",
        quoted(table.table),
        column_list(table),
        values(table, rows, placeholder),
    )
}

/// The statement for `write` of `rows` of `table`'s models in standard SQL (double-quoted
/// identifiers, `ON CONFLICT`, `UPDATE … FROM`), parameter `n` written `placeholder(n)`: each
/// model's columns are parameters of their own types (a deletion's, its key alone).
pub fn model_sql(
    write: Write,
    table: &ModelTable,
    rows: usize,
    placeholder: fn(usize) -> String,
) -> String {
    let table_name = quoted(table.table);
    let key = quoted(table.key);
    match write {
        Write::Insert => insert_sql(table, rows, placeholder),
        Write::Save => {
            let set: Vec<String> = table
                .updated_columns()
                .iter()
                .map(|column| format!("{0} = EXCLUDED.{0}", quoted(column)))
                .collect();
            format!(
                "{} ON CONFLICT ({key}) DO UPDATE SET {}",
                insert_sql(table, rows, placeholder),
                set.join(", "),
            )
        }
        Write::Update => {
            let set: Vec<String> = table
                .updated_columns()
                .iter()
                .map(|column| format!("{0} = s.{0}", quoted(column)))
                .collect();
            format!(
                "WITH s ({}) AS (VALUES {}) UPDATE {table_name} SET {} FROM s \
                 WHERE {table_name}.{key} = s.{key}",
                column_list(table),
                values(table, rows, placeholder),
                set.join(", "),
            )
        }
        Write::Delete => {
            let keys: Vec<String> = (1..=rows).map(placeholder).collect();
            format!(
                "DELETE FROM {table_name} WHERE {key} IN ({})",
                keys.join(", ")
            )
        }
    }
}

/// The statement that reads the table's columns, every one of them, as one row of `NULL`s:
/// what [`check_model`](crate::model::check_model) compares a model with (the row's columns carry their types).
pub fn columns_sql(table: &ModelTable) -> String {
    format!(
        "SELECT t.* FROM (SELECT 1) AS one LEFT JOIN {} AS t ON 1 = 0",
        quoted(table.table)
    )
}
