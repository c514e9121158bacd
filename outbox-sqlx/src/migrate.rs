//! The embedded migrations, recorded in the outbox's own table.
//!
//! # Upgrades
//!
//! The outbox migrations are additive: a migration adds tables, columns, indexes or
//! constraints that older binaries' statements do not contradict, and never renames or drops
//! what an older binary reads or writes. So a binary that embeds migrations up to N runs
//! against a schema at N, or at any newer version: during a rolling deploy, old and new
//! binaries run side by side once the new one has migrated. [`migrate`] of an older binary on
//! a newer schema applies nothing and succeeds, and both it and the store's start-up check
//! say once, in a `warn` log line, which versions the binary knows and which the database has.
//! A migration may add a capability that older binaries cannot read — identifiers wider than
//! an `i64` (PostgreSQL migration 2, SQLite migration 3): the old binaries keep working beside
//! it, but use the capability (write a wide identifier) only once every binary that runs a
//! relay on the database embeds the migration.
//! A schema older than the binary is not enough: apply the binary's migrations first
//! (`migrate(&pool)`, or the SQL files in the backend crate's `migrations/` with the
//! migration tool of your own); until then the relay refuses to start
//! ([`Error::MigrationMissing`]).

use std::borrow::Cow;
use std::fmt::Write as _;

use outbox_core::Error;
use outbox_core::store::MIGRATIONS_TABLE;
use sqlx::migrate::{Migrate, Migration, MigrationType, Migrator};
use sqlx::{Pool, SqlSafeStr};

use crate::dialect::Dialect;
use crate::error::DriverError;

/// The migrator for a backend's outbox tables, recorded in `_outbox_migrations`.
///
/// It accepts a database that has applied migrations it does not embed (a newer binary's):
/// outbox migrations are additive, so an older binary keeps working on a newer schema.
pub fn migrator<D: Dialect>() -> Migrator {
    migrator_up_to::<D>(i64::MAX)
}

/// The migrator of the backend's migrations up to `version`, inclusive: what a binary that
/// embeds only those applies. To stage an upgrade, or to test one.
pub fn migrator_up_to<D: Dialect>(version: i64) -> Migrator {
    let migrations = D::MIGRATIONS
        .iter()
        .filter(|m| m.version <= version)
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
    migrator.set_ignore_missing(true);
    migrator
}

/// Applies the outbox migrations that `pool`'s database lacks. Idempotent, and safe to run
/// from several processes at once.
///
/// A database that has applied migrations newer than this binary's (during a rolling deploy,
/// say) is left as it is, and a `warn` line names both sets of versions: the binary runs on it
/// (see the [module documentation](self)).
pub async fn migrate<D: Dialect>(pool: &Pool<D::Database>) -> Result<(), Error> {
    migrator::<D>()
        .run(pool)
        .await
        .map_err(migrate_error::<D>)?;
    note_newer_schema::<D>(&applied::<D>(pool).await?);
    Ok(())
}

/// The versions of the outbox migrations `pool`'s database has applied, in order; none (and
/// the migrations table created) before the first.
pub async fn applied<D: Dialect>(pool: &Pool<D::Database>) -> Result<Vec<i64>, Error> {
    let failed = migrate_error::<D>;
    let mut conn = pool
        .acquire()
        .await
        .map_err(|source| failed(source.into()))?;
    conn.ensure_migrations_table(MIGRATIONS_TABLE)
        .await
        .map_err(failed)?;
    let mut versions: Vec<i64> = conn
        .list_applied_migrations(MIGRATIONS_TABLE)
        .await
        .map_err(failed)?
        .into_iter()
        .map(|migration| migration.version)
        .collect();
    versions.sort_unstable();
    Ok(versions)
}

/// Every outbox migration of dialect `D` as SQL, each in a transaction with the row that
/// records it in the migrations table as the library's migrator would, checksum included:
/// applied by a migration tool of the user's own, the relay's start-up check finds them.
pub fn script<D: Dialect>() -> String {
    let mut sql = format!(
        "-- The outbox migrations for {}, each recorded in {MIGRATIONS_TABLE} as the outbox's\n\
         -- own migrator records it. Apply those the database lacks, in order.\n\n{}\n",
        D::NAME,
        D::MIGRATIONS_TABLE,
    );
    for migration in migrator::<D>().iter() {
        let checksum: String = migration
            .checksum
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let _ = write!(
            sql,
            "\n-- Migration {}: {}\nBEGIN;\n{}\nINSERT INTO {MIGRATIONS_TABLE} (version, \
             description, success, checksum, execution_time)\nVALUES ({}, '{}', TRUE, {}, 0);\n\
             COMMIT;\n",
            migration.version,
            migration.description,
            migration.sql.as_str().trim_end(),
            migration.version,
            migration.description.replace('\'', "''"),
            D::binary_literal(&checksum),
        );
    }
    sql
}

/// A migrator's error as [`Error::Migrate`]: which migration failed (its version and
/// description), the database's message, and, where the database refused for want of a
/// right, what to do about it.
pub fn migrate_error<D: Dialect>(error: sqlx::migrate::MigrateError) -> Error {
    use sqlx::migrate::MigrateError;
    let (step, driver) = match error {
        MigrateError::ExecuteMigration(source, version) => {
            let description = D::MIGRATIONS
                .iter()
                .find(|migration| migration.version == version)
                .map_or("", |migration| migration.description);
            (
                format!("migration {version} ({description})"),
                DriverError::new(source),
            )
        }
        MigrateError::Execute(source) => (
            format!("preparing the `{MIGRATIONS_TABLE}` table"),
            DriverError::new(source),
        ),
        other => {
            return Error::Migrate {
                detail: other.to_string(),
                source: Box::new(other),
            };
        }
    };
    let remedy = match driver.sqlx() {
        sqlx::Error::Database(db) if is_refused_right(db.as_ref()) => format!(
            ": the database refused this connection's {} the right to change the schema; apply \
             the migrations as one that has it (the schema's owner), with `migrate` or `outbox \
             migrate`, or print them with `outbox migrate --print` for one that does",
            if D::NAME == "SQLite" {
                "process"
            } else {
                "role"
            }
        ),
        _ => String::new(),
    };
    Error::Migrate {
        detail: format!("{step} failed: {driver}{remedy}"),
        source: Box::new(driver),
    }
}

/// Whether the database refused a statement for want of a right: PostgreSQL's
/// `insufficient_privilege` (42501), SQLite's read-only database or file (`SQLITE_READONLY`
/// and its extended codes, `SQLITE_PERM`, `SQLITE_AUTH`).
fn is_refused_right(error: &dyn sqlx::error::DatabaseError) -> bool {
    let Some(code) = error.code() else {
        return false;
    };
    if code == "42501" {
        return true;
    }
    match code.parse::<i32>() {
        // SQLite: the primary code is the low byte of an extended one.
        Ok(code) => matches!(code & 0xff, 3 | 8 | 23),
        Err(_) => false,
    }
}

/// The versions among `applied` that are newer than every migration this binary embeds.
pub(crate) fn newer_versions<D: Dialect>(applied: &[i64]) -> Vec<i64> {
    let newest_known = D::MIGRATIONS
        .iter()
        .map(|migration| migration.version)
        .max()
        .unwrap_or(0);
    applied
        .iter()
        .copied()
        .filter(|version| *version > newest_known)
        .collect()
}

/// Says, in one `warn` line, that the database's schema is newer than this binary's, if it is.
pub(crate) fn note_newer_schema<D: Dialect>(applied: &[i64]) {
    if newer_versions::<D>(applied).is_empty() {
        return;
    }
    let known: Vec<i64> = D::MIGRATIONS.iter().map(|m| m.version).collect();
    tracing::warn!(
        backend = D::NAME,
        "the outbox schema is newer than this binary (it knows migrations {known:?}, the \
         database has {applied:?}): running on it, as outbox migrations are additive; finish \
         the rollout to the newer binary"
    );
}
