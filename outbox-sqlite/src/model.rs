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

#[cfg(test)]
mod tests {
    use outbox_sqlx::Write;
    use outbox_sqlx::model::model_sql;

    use super::*;
    use crate::SqliteDialect;

    const TABLE: ModelTable = ModelTable {
        table: "app.projects",
        key: "id",
        columns: &["id", "organization_id", "name"],
        bool_columns: &[],
    };

    #[test]
    fn statements_quote_identifiers_and_read_json() {
        assert_eq!(
            model_sql::<SqliteDialect>(Write::Save, &TABLE),
            "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
             SELECT s.value ->> 'id', s.value ->> 'organization_id', s.value ->> 'name' \
             FROM json_each(?1) AS s WHERE true \
             ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = EXCLUDED.\"organization_id\", \
             \"name\" = EXCLUDED.\"name\""
        );
        assert_eq!(
            model_sql::<SqliteDialect>(Write::Update, &TABLE),
            "UPDATE \"app\".\"projects\" SET \"organization_id\" = s.value ->> 'organization_id', \
             \"name\" = s.value ->> 'name' FROM json_each(?1) AS s \
             WHERE \"app\".\"projects\".\"id\" = s.value ->> 'id'"
        );
        assert_eq!(
            load_sql(&TABLE),
            "SELECT json_object('id', \"id\", 'organization_id', \"organization_id\", 'name', \
             \"name\") FROM \"app\".\"projects\" WHERE \"id\" = ?1"
        );
        assert_eq!(value("it's"), "s.value ->> 'it''s'");
    }

    #[test]
    fn a_key_only_table_updates_its_key() {
        let table = ModelTable {
            columns: &["id"],
            ..TABLE
        };
        assert!(
            model_sql::<SqliteDialect>(Write::Save, &table)
                .ends_with("DO UPDATE SET \"id\" = EXCLUDED.\"id\"")
        );
    }
}
