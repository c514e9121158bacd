//! Replicated models on SQLite: the pieces of the statements that write them and read them
//! back.
//!
//! Each model's fields are parameters of their own types; a row is read back by each value's
//! own storage class (a blob as bytes, an integer as an integer).

use outbox_core::columns::{ColumnValue, ModelRow};

use outbox_core::replicated::ModelTable;
use outbox_sqlx::model::{column_list, quoted};
use sqlx::sqlite::{SqliteRow, SqliteTypeInfo};
use sqlx::{Column, Row, TypeInfo, ValueRef};

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The names of `table`'s columns declared `JSON` (whose text is a document, not a string),
/// as a JSON array: the last of the columns [`read`] reads.
fn json_columns(table: &ModelTable) -> String {
    let info = match table.table.split_once('.') {
        Some((schema, name)) => {
            format!("pragma_table_info({}, {})", literal(name), literal(schema))
        }
        None => format!("pragma_table_info({})", literal(table.table)),
    };
    format!("(SELECT json_group_array(name) FROM {info} WHERE lower(type) IN ('json', 'jsonb'))")
}

/// The columns of a model's row as [`read`] reads them: the table's, then [`json_columns`].
fn read_columns(table: &ModelTable) -> String {
    format!("{}, {}", column_list(table), json_columns(table))
}

/// The statement the relay reads an object with: its columns, then the names of those
/// declared `JSON` (whose text is a document, not a string) as a JSON array.
pub(crate) fn load_sql(table: &ModelTable) -> String {
    // `?1` is an integer or a wide key's 16 bytes: a BLOB, as sqlx stores a UUID.
    format!(
        "SELECT {} FROM {} WHERE {} = ?1",
        read_columns(table),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The name of [`load_many_sql`]'s last column: a key's position, no column of the model's.
const POSITION: &str = "outbox_key_position";

/// The statement the relay reads many objects with: each key of the JSON array `?1` (an
/// integer, or a wide key's hex digits) with its object's row as [`load_sql`] reads it (one
/// index probe per key), then the key's position in the array, from 1.
pub(crate) fn load_many_sql(table: &ModelTable) -> String {
    let columns = table
        .columns
        .iter()
        .map(|column| format!("t.{}", quoted(column)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT {columns}, {}, k.key + 1 AS {POSITION} FROM json_each(?1) AS k \
         JOIN {} AS t ON t.{} = iif(k.type = 'text', unhex(k.value), k.value)",
        json_columns(table),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement a backfill reads a batch with: the rows above the low bound `?1` (an integer
/// or a wide key's 16 bytes) if there is one, in key order, at most `?2` (`?1` without a low
/// bound), each as [`load_sql`] reads one.
pub(crate) fn walk_sql(table: &ModelTable, after: bool) -> String {
    let key = quoted(table.key);
    let (filter, limit) = if after {
        (format!(" WHERE {key} > ?1"), "?2")
    } else {
        (String::new(), "?1")
    };
    format!(
        "SELECT {} FROM {}{filter} ORDER BY {key} LIMIT {limit}",
        read_columns(table),
        quoted(table.table),
    )
}

/// A row of [`load_sql`], each value by its storage class (the text of a `JSON` column as the
/// document it holds).
pub(crate) fn read(row: &SqliteRow) -> Result<ModelRow, sqlx::Error> {
    let columns = match row.columns().split_last() {
        Some((last, columns)) if last.name() == POSITION => columns,
        _ => row.columns(),
    };
    let Some((json_columns, columns)) = columns.split_last() else {
        return Ok(ModelRow::new());
    };
    let json_columns: String = row.try_get(json_columns.ordinal())?;
    let json_columns: Vec<String> =
        serde_json::from_str(&json_columns).map_err(|error| sqlx::Error::Decode(error.into()))?;
    let mut model = ModelRow::new();
    for column in columns {
        let index = column.ordinal();
        let raw = row.try_get_raw(index)?;
        let value = if raw.is_null() {
            ColumnValue::Null
        } else {
            let class = raw.type_info().name().to_owned();
            match class.as_str() {
                "INTEGER" | "BOOLEAN" => ColumnValue::Integer(row.try_get_unchecked(index)?),
                "REAL" => ColumnValue::Real(row.try_get_unchecked(index)?),
                "BLOB" => ColumnValue::Bytes(row.try_get_unchecked(index)?),
                _ => {
                    let text: String = row.try_get_unchecked(index)?;
                    match json_columns.iter().any(|name| name == column.name()) {
                        true => serde_json::from_str(&text)
                            .map_or(ColumnValue::Text(text), ColumnValue::Json),
                        false => ColumnValue::Text(text),
                    }
                }
            }
        };
        model.push(column.name(), value);
    }
    Ok(model)
}

/// Whether a column of type `column` holds `field`'s values as they are. SQLite's declared
/// types are affinities: one that says nothing of the values (`NUMERIC`, dates and times, a
/// name SQLite does not know) holds what it is given; the others (integer, real, text, blob)
/// convert values of another kind, so the driver's answer stands.
pub(crate) fn accepts(_field: &SqliteTypeInfo, column: &SqliteTypeInfo, compatible: bool) -> bool {
    compatible
        || matches!(
            column.name(),
            "NULL" | "NUMERIC" | "DATE" | "TIME" | "DATETIME"
        )
}
