//! The embedded migrations, recorded in the outbox's own table.

use std::borrow::Cow;

use outbox_core::Error;
use outbox_core::store::MIGRATIONS_TABLE;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Pool, SqlSafeStr};

use crate::dialect::Dialect;

/// The migrator for a backend's outbox tables, recorded in `_outbox_migrations`.
pub fn migrator<D: Dialect>() -> Migrator {
    let migrations = D::MIGRATIONS
        .iter()
        .map(|m| {
            Migration::new(
                m.version,
                Cow::Borrowed(m.description),
                MigrationType::Simple,
                m.sql.into_sql_str(),
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
pub async fn migrate<D: Dialect>(pool: &Pool<D::Database>) -> Result<(), Error> {
    migrator::<D>()
        .run(pool)
        .await
        .map_err(|source| Error::Migrate {
            source: Box::new(source),
        })
}
