//! Replicated models on MariaDB: the statements that write them and read them back.
//!
//! Identifiers are quoted with backticks (a user's connection need not run with
//! `ANSI_QUOTES`). Each model's fields are parameters of their own types; a row is read back
//! column by column, by the type MariaDB reports for it.

use outbox_core::columns::{ColumnValue, ModelRow};
use outbox_core::replicated::ModelTable;
use outbox_sqlx::model::Write;
use sqlx::mysql::{MySqlRow, MySqlTypeInfo};
use sqlx::{Column, Row, TypeInfo, ValueRef};

/// An identifier (`projects`, or `app.projects`), quoted with backticks.
pub(crate) fn quoted(identifier: &str) -> String {
    identifier
        .split('.')
        .map(|part| format!("`{}`", part.replace('`', "``")))
        .collect::<Vec<_>>()
        .join(".")
}

/// The table's columns, quoted, separated by commas, each behind `prefix`.
fn column_list(table: &ModelTable, prefix: &str) -> String {
    table
        .columns
        .iter()
        .map(|column| format!("{prefix}{}", quoted(column)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `rows` rows of `width` parameters: `(?, ?), (?, ?)`.
fn values(width: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; width].join(", "));
    vec![row; rows].join(", ")
}

/// The statement for `write` of `rows` of `table`'s models: each model's columns are
/// parameters of their own types, in row order (a deletion's, its key alone).
pub(crate) fn model_sql(write: Write, table: &ModelTable, rows: usize) -> String {
    let table_name = quoted(table.table);
    let key = quoted(table.key);
    let width = table.columns.len();
    let insert = || {
        format!(
            "INSERT INTO {table_name} ({}) VALUES {}",
            column_list(table, ""),
            values(width, rows)
        )
    };
    match write {
        Write::Insert => insert(),
        Write::Save => {
            let set: Vec<String> = table
                .updated_columns()
                .iter()
                .map(|column| format!("{0} = VALUES({0})", quoted(column)))
                .collect();
            format!("{} ON DUPLICATE KEY UPDATE {}", insert(), set.join(", "))
        }
        Write::Update => {
            // The rows as a derived table: the first names its columns.
            let first = table
                .columns
                .iter()
                .map(|column| format!("? AS {}", quoted(column)))
                .collect::<Vec<_>>()
                .join(", ");
            let rest = format!(" UNION ALL SELECT {}", vec!["?"; width].join(", "));
            let set: Vec<String> = table
                .updated_columns()
                .iter()
                .map(|column| format!("t.{0} = s.{0}", quoted(column)))
                .collect();
            format!(
                "UPDATE {table_name} AS t JOIN (SELECT {first}{}) AS s ON t.{key} = s.{key} \
                 SET {}",
                rest.repeat(rows.saturating_sub(1)),
                set.join(", "),
            )
        }
        Write::Delete => format!(
            "DELETE FROM {table_name} WHERE {key} IN ({})",
            vec!["?"; rows].join(", ")
        ),
    }
}

/// The statement that reads the table's columns, every one of them, as one row of `NULL`s.
pub(crate) fn columns_sql(table: &ModelTable) -> String {
    format!(
        "SELECT t.* FROM (SELECT 1) AS one LEFT JOIN {} AS t ON 1 = 0",
        quoted(table.table)
    )
}

/// The statement the relay reads an object with: its columns. `?` is an integer or a wide
/// key's 16 bytes.
pub(crate) fn load_sql(table: &ModelTable) -> String {
    format!(
        "SELECT {} FROM {} WHERE {} = ?",
        column_list(table, ""),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The name of [`load_many_sql`]'s last column: a key's position, no column of the model's.
const POSITION: &str = "outbox_key_position";

/// The statement the relay reads many objects with: each key of the JSON array `?` (integers,
/// or wide keys' hex digits) with its object's row as [`load_sql`] reads it (one index probe
/// per key), then the key's position in the array, from 1.
pub(crate) fn load_many_sql(table: &ModelTable) -> String {
    format!(
        "SELECT {}, k.n AS {POSITION} \
         FROM JSON_TABLE(?, '$[*]' COLUMNS (n FOR ORDINALITY, \
            k JSON PATH '$')) AS k \
         JOIN {} AS t ON t.{} = IF(JSON_TYPE(k.k) = 'STRING', UNHEX(JSON_UNQUOTE(k.k)), k.k)",
        column_list(table, "t."),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement a backfill reads a batch with: the rows above the low bound `?` (an integer
/// or a wide key's 16 bytes) if `after`, in key order, at most `?` (the limit).
pub(crate) fn walk_sql(table: &ModelTable, after: bool) -> String {
    let key = quoted(table.key);
    let filter = if after {
        format!(" WHERE {key} > ?")
    } else {
        String::new()
    };
    format!(
        "SELECT {} FROM {}{filter} ORDER BY {key} LIMIT ?",
        column_list(table, ""),
        quoted(table.table),
    )
}

/// A row of [`load_sql`], each value by the type MariaDB reports for its column.
pub(crate) fn read(row: &MySqlRow) -> Result<ModelRow, sqlx::Error> {
    let columns = match row.columns().split_last() {
        Some((last, columns)) if last.name() == POSITION => columns,
        _ => row.columns(),
    };
    let mut model = ModelRow::new();
    for column in columns {
        let index = column.ordinal();
        let raw = row.try_get_raw(index)?;
        let value = if raw.is_null() {
            ColumnValue::Null
        } else {
            let name = column.type_info().name().to_owned();
            match name.as_str() {
                "BOOLEAN" | "TINYINT" | "SMALLINT" | "MEDIUMINT" | "INT" | "BIGINT" => {
                    ColumnValue::Integer(row.try_get_unchecked(index)?)
                }
                "FLOAT" | "DOUBLE" => ColumnValue::Real(row.try_get_unchecked(index)?),
                "BINARY" | "VARBINARY" | "TINYBLOB" | "BLOB" | "MEDIUMBLOB" | "LONGBLOB" => {
                    ColumnValue::Bytes(row.try_get_unchecked(index)?)
                }
                "JSON" => {
                    let text: String = row.try_get_unchecked(index)?;
                    serde_json::from_str(&text).map_or(ColumnValue::Text(text), ColumnValue::Json)
                }
                _ => ColumnValue::Text(row.try_get_unchecked(index)?),
            }
        };
        model.push(column.name(), value);
    }
    Ok(model)
}

/// Whether a column of type `column` holds `field`'s values as they are: the driver's
/// answer, or a wider integer.
pub(crate) fn accepts(field: &MySqlTypeInfo, column: &MySqlTypeInfo, compatible: bool) -> bool {
    const INTEGERS: [&str; 5] = ["TINYINT", "SMALLINT", "MEDIUMINT", "INT", "BIGINT"];
    let rank = |name| INTEGERS.iter().position(|integer| *integer == name);
    compatible
        || matches!((rank(field.name()), rank(column.name())),
            (Some(field), Some(column)) if field <= column)
}
