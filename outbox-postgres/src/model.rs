//! Replicated models on PostgreSQL: the pieces of the statements that write them and read
//! them back.
//!
//! Each model's fields are parameters of their own types (`bytea` bytes, `uuid`s, timestamps
//! as themselves); a row is read back as JSON (`to_json`, which renders timestamps, numerics,
//! UUIDs and arrays as serde reads them), its `bytea` columns beside it as bytes.

use outbox_core::columns::{ColumnValue, ModelRow};

use outbox_core::replicated::ModelTable;
use outbox_sqlx::model::{column_list, quoted};
use sqlx::postgres::{PgRow, PgTypeInfo};
use sqlx::{Column, Row, TypeInfo};

/// Parameter `$1` as a key: a wide key's 16 bytes compared as the UUID they are.
fn key_parameter(wide: bool) -> &'static str {
    if wide {
        "encode($1::bytea, 'hex')::uuid"
    } else {
        "$1"
    }
}

/// The statement a backfill reads a batch with: the rows above the low bound (`$1`, if
/// `after` says of what kind), in key order, at most `$2` (`$1` without a low bound), each as
/// [`load_sql`] reads one.
pub(crate) fn walk_sql(table: &ModelTable, after: Option<bool>) -> String {
    let key = quoted(table.key);
    let (filter, limit) = match after {
        None => (String::new(), "$1"),
        Some(wide) => (format!(" WHERE {key} > {}", key_parameter(wide)), "$2"),
    };
    format!(
        "SELECT to_json(s)::text, s.* FROM (SELECT {} FROM {}{filter} ORDER BY {key} \
         LIMIT {limit}) AS s ORDER BY s.{key}",
        column_list(table),
        quoted(table.table),
    )
}

/// The statement the relay reads an object with: its columns as one JSON object, then the
/// columns themselves (whose `bytea`s are read as bytes). A wide key's 16 bytes are compared
/// as the UUID they are.
pub(crate) fn load_sql(table: &ModelTable, wide: bool) -> String {
    let key = key_parameter(wide);
    format!(
        "SELECT to_json(s)::text, s.* FROM (SELECT {} FROM {} WHERE {} = {key}) AS s",
        column_list(table),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement the relay reads many objects with: each key of `$1` (an array of integers,
/// or of wide keys' 16 bytes) with its position, and its object's row as [`load_sql`] reads
/// it (one index probe per key), the position last.
pub(crate) fn load_many_sql(table: &ModelTable, wide: bool) -> String {
    let (keys, key) = if wide {
        ("$1::bytea[]", "encode(k.key, 'hex')::uuid")
    } else {
        ("$1::bigint[]", "k.key")
    };
    format!(
        "SELECT to_json(s)::text, s.*, k.position FROM unnest({keys}) WITH ORDINALITY          AS k(key, position) CROSS JOIN LATERAL (SELECT {} FROM {} WHERE {} = {key}) AS s",
        column_list(table),
        quoted(table.table),
        quoted(table.key),
    )
}

/// A row of [`load_sql`] (or of [`load_many_sql`], whose last column is no model's).
pub(crate) fn read(row: &PgRow) -> Result<ModelRow, sqlx::Error> {
    let json: String = row.try_get(0)?;
    let json = serde_json::from_str(&json).map_err(|error| sqlx::Error::Decode(error.into()))?;
    let mut model = ModelRow::from_json(json)
        .ok_or_else(|| sqlx::Error::Decode("a model's row is not a JSON object".into()))?;
    // A `bytea` column is one of the model's: the position after them is an integer.
    for column in row.columns().iter().skip(1) {
        if column.type_info().name() == "BYTEA" {
            let bytes: Option<Vec<u8>> = row.try_get(column.ordinal())?;
            let value = bytes.map_or(ColumnValue::Null, ColumnValue::Bytes);
            model.set(column.name(), value);
        }
    }
    Ok(model)
}

/// Integer types, narrowest first.
const INTEGERS: [&str; 3] = ["INT2", "INT4", "INT8"];

/// Whether a column of type `column` holds `field`'s values as they are: the driver's answer,
/// or a wider number (an `i32` in a `BIGINT`, an `f32` in a `DOUBLE PRECISION`, any number in
/// a `NUMERIC`).
pub(crate) fn accepts(field: &PgTypeInfo, column: &PgTypeInfo, compatible: bool) -> bool {
    let (field, column) = (field.name(), column.name());
    let rank = |name| INTEGERS.iter().position(|integer| *integer == name);
    let number = |name| rank(name).is_some() || matches!(name, "FLOAT4" | "FLOAT8");
    compatible
        || matches!((rank(field), rank(column)), (Some(field), Some(column)) if field <= column)
        || (field == "FLOAT4" && column == "FLOAT8")
        || (number(field) && column == "NUMERIC")
}
