use outbox_core::Error;

/// Maps a driver error: connectivity to [`Error::Unavailable`], a missing outbox table to
/// [`Error::MigrationMissing`], anything else to [`Error::Database`].
pub(crate) fn database(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |error| match error {
        sqlx::Error::Database(ref db)
            if db.message().starts_with("no such table: outbox_")
                || db.message().starts_with("no such column") =>
        {
            Error::MigrationMissing {
                detail: db.message().to_owned(),
            }
        }
        error => on_table(operation)(error),
    }
}

/// Maps a driver error on an application table: connectivity to [`Error::Unavailable`],
/// anything else to [`Error::Database`].
pub(crate) fn on_table(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |error| match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::Unavailable {
            source: Box::new(error),
        },
        error => Error::Database {
            operation,
            source: Box::new(error),
        },
    }
}
