use std::borrow::Cow;

use outbox_core::Error;
use outbox_core::store::{EmbeddedMigration, MIGRATIONS_TABLE};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{SqlSafeStr, SqlitePool};

/// The embedded migrations, in order.
pub(crate) const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "outbox tables",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "outbox rows checked at write time",
        sql: include_str!("../migrations/0002_checked_messages.sql"),
    },
];

/// The migrator for the outbox tables, recorded in `_outbox_migrations`.
pub fn migrator() -> Migrator {
    let migrations = MIGRATIONS
        .iter()
        .map(|m| {
            let sql = m.sql.into_sql_str();
            Migration::new(
                m.version,
                Cow::Borrowed(m.description),
                MigrationType::Simple,
                sql,
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// Applies the outbox migrations that `pool`'s database lacks. Idempotent, and safe to run
/// from several processes at once.
pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    migrator().run(pool).await.map_err(|source| Error::Migrate {
        source: Box::new(source),
    })
}
