//! Replicated models on SQLite: the statements that write them and read them back.
//!
//! The models travel to the database as one JSON array parameter, as the outbox rows do:
//! `json_each` turns it into rows, `->>` into column values.

use outbox_core::ModelTable;
use outbox_sqlx::Write;
use outbox_sqlx::model::{column_list, quoted};

/// `value ->> 'column'` for each column, from the `json_each` row `source`.
fn values(table: &ModelTable, source: &str) -> Vec<String> {
    table
        .columns
        .iter()
        .map(|column| format!("{source}.value ->> '{column}'"))
        .collect()
}

fn insert_sql(table: &ModelTable) -> String {
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM json_each(?1) AS s WHERE true ORDER BY s.key",
        quoted(table.table),
        column_list(table, ""),
        values(table, "s").join(", "),
    )
}

fn save_sql(table: &ModelTable) -> String {
    let set: Vec<String> = table
        .updated_columns()
        .iter()
        .map(|column| format!("{0} = excluded.{0}", quoted(column)))
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
        .map(|column| format!("{} = s.value ->> '{column}'", quoted(column)))
        .collect();
    format!(
        "UPDATE {} SET {} FROM json_each(?1) AS s WHERE {}.{} = s.value ->> '{}'",
        quoted(table.table),
        set.join(", "),
        quoted(table.table),
        quoted(table.key),
        table.key,
    )
}

fn delete_sql(table: &ModelTable) -> String {
    format!(
        "DELETE FROM {} WHERE {} IN (SELECT value FROM json_each(?1))",
        quoted(table.table),
        quoted(table.key),
    )
}

/// The statement the relay reads an object with: its columns as one JSON object.
pub(crate) fn load_sql(table: &ModelTable) -> String {
    let fields: Vec<String> = table
        .columns
        .iter()
        .map(|column| format!("'{column}', {}", quoted(column)))
        .collect();
    format!(
        "SELECT json_object({}) FROM {} WHERE {} = ?1",
        fields.join(", "),
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
    fn statements_quote_identifiers_and_read_json() {
        assert_eq!(
            save_sql(&TABLE),
            "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
             SELECT s.value ->> 'id', s.value ->> 'organization_id', s.value ->> 'name' \
             FROM json_each(?1) AS s WHERE true ORDER BY s.key \
             ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = excluded.\"organization_id\", \
             \"name\" = excluded.\"name\""
        );
        assert_eq!(
            load_sql(&TABLE),
            "SELECT json_object('id', \"id\", 'organization_id', \"organization_id\", 'name', \
             \"name\") FROM \"app\".\"projects\" WHERE \"id\" = ?1"
        );
    }

    #[test]
    fn a_key_only_table_updates_its_key() {
        let table = ModelTable {
            columns: &["id"],
            ..TABLE
        };
        assert!(save_sql(&table).ends_with("DO UPDATE SET \"id\" = excluded.\"id\""));
    }
}
