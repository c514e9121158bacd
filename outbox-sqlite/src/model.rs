//! Replicated models on SQLite: the pieces of the statements that write them and read them
//! back.
//!
//! The models travel to the database as one JSON array parameter, as the outbox rows do:
//! `json_each` turns it into rows, `->>` into column values.

use outbox_core::ModelTable;
use outbox_sqlx::model::quoted;

/// `column` as an SQL string literal.
fn literal(column: &str) -> String {
    format!("'{}'", column.replace('\'', "''"))
}

/// The rows of parameter `?1`.
pub(crate) fn rows() -> String {
    "json_each(?1) AS s".to_owned()
}

/// A column of those rows.
pub(crate) fn value(column: &str) -> String {
    format!("s.value ->> {}", literal(column))
}

/// The key is one of the JSON array `?1`.
pub(crate) fn key_in_list(key: &str) -> String {
    format!("{key} IN (SELECT value FROM json_each(?1))")
}

/// The statement the relay reads an object with: its columns as one JSON object.
pub(crate) fn load_sql(table: &ModelTable) -> String {
    let fields: Vec<String> = table
        .columns
        .iter()
        .map(|column| format!("{}, {}", literal(column), quoted(column)))
        .collect();
    format!(
        "SELECT json_object({}) FROM {} WHERE {} = ?1",
        fields.join(", "),
        quoted(table.table),
        quoted(table.key),
    )
}
