use std::borrow::Cow;

use outbox_core::Error;
use sqlx::SqlitePool;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// The table recording which outbox migrations a database has applied.
pub const MIGRATIONS_TABLE: &str = "_outbox_migrations";

/// The embedded migrations, in order: `(version, description, sql)`.
pub(crate) const MIGRATIONS: &[(i64, &str, &str)] = &[(
    1,
    "outbox tables",
    include_str!("../migrations/0001_outbox.sql"),
)];

/// The migrator for the outbox tables, tracked in [`MIGRATIONS_TABLE`].
pub fn migrator() -> Migrator {
    let migrations = MIGRATIONS
        .iter()
        .map(|(version, description, sql)| {
            Migration::new(
                *version,
                Cow::Borrowed(*description),
                MigrationType::Simple,
                sqlx::SqlSafeStr::into_sql_str(*sql),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// Applies the outbox migrations that `pool`'s database lacks. Idempotent.
pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    migrator()
        .run(pool)
        .await
        .map_err(|source| Error::Migrate {
            source: Box::new(source),
        })
}

pub(crate) fn required() -> Vec<(i64, &'static str)> {
    MIGRATIONS
        .iter()
        .map(|(version, description, _)| (*version, *description))
        .collect()
}
