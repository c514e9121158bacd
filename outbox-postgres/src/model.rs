//! Replicated models on PostgreSQL: the pieces of the statements that write them and read
//! them back.
//!
//! The models travel to the database as one JSON array parameter, which
//! `json_populate_recordset` turns into rows of the table's own type, so PostgreSQL converts
//! each value to its column's type.

use outbox_core::ModelTable;
use outbox_sqlx::model::{column_list, quoted};

/// The rows of parameter `$1`, typed as the table's rows.
pub(crate) fn rows(table: &ModelTable) -> String {
    format!(
        "json_populate_recordset(NULL::{}, $1::text::json) AS s",
        quoted(table.table)
    )
}

/// A column of those rows.
pub(crate) fn value(column: &str) -> String {
    format!("s.{}", quoted(column))
}

/// The key is one of the array `$1`.
pub(crate) fn key_in_list(key: &str) -> String {
    format!("{key} = ANY($1)")
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
