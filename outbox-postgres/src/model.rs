//! Replicated models on PostgreSQL: the statements that write them and read them back.
//!
//! The models travel to the database as one JSON array parameter, which
//! `json_populate_recordset` turns into rows of the table's own type, so PostgreSQL converts
//! each value to its column's type.

use outbox_core::ModelTable;
use outbox_sqlx::Write;
use outbox_sqlx::model::{column_list, quoted};

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
        column_list(table, ""),
        column_list(table, "s."),
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
        column_list(table, ""),
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement for `write` of `table`'s models.
pub(crate) fn model_sql(write: Write, table: &ModelTable) -> String {
    match write {
        Write::Insert => insert_sql(table),
        Write::Update => update_sql(table),
        Write::Save => save_sql(table),
        Write::Delete => delete_sql(table),
    }
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
