use outbox_core::Error;

/// Maps a driver error: connectivity (including a server shutting down or a terminated
/// session) to [`Error::Unavailable`], a missing outbox relation to [`Error::MigrationMissing`],
/// anything else to [`Error::Database`].
pub(crate) fn database(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |error| match error {
        sqlx::Error::Database(ref db)
            // undefined_table, undefined_column, undefined_function
            if matches!(db.code().as_deref(), Some("42P01" | "42703" | "42883")) =>
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
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::Unavailable {
            source: Box::new(error),
        },
        sqlx::Error::Database(ref db) => match db.code().as_deref() {
            // connection_exception (08xxx), operator_intervention (57xxx: shutdown,
            // terminated session), cannot_connect_now
            Some(code) if code.starts_with("08") || code.starts_with("57") => Error::Unavailable {
                source: Box::new(error),
            },
            _ => Error::Database {
                operation,
                source: Box::new(error),
            },
        },
        error => Error::Database {
            operation,
            source: Box::new(error),
        },
    }
}
