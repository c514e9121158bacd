//! Driver errors as the outbox's typed errors.

use outbox_core::Error;

use crate::dialect::{Dialect, Fault};

/// Maps a driver error on the outbox's own tables: connectivity (the connection, the pool, or
/// the server saying it is going away) to [`Error::Unavailable`], a missing outbox table or
/// column to [`Error::MigrationMissing`], anything else to [`Error::Database`].
pub fn database<D: Dialect>(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |error| match fault::<D>(&error) {
        Fault::SchemaMissing => Error::MigrationMissing {
            detail: match &error {
                sqlx::Error::Database(db) => db.message().to_owned(),
                other => other.to_string(),
            },
        },
        fault => typed(operation, fault, error),
    }
}

/// Maps a driver error on an application table (a replicated model's): connectivity to
/// [`Error::Unavailable`], anything else (a missing table included: it is not the outbox's) to
/// [`Error::Database`].
pub fn on_table<D: Dialect>(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |error| {
        let fault = fault::<D>(&error);
        typed(operation, fault, error)
    }
}

fn fault<D: Dialect>(error: &sqlx::Error) -> Fault {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Fault::Unavailable,
        sqlx::Error::Database(db) => D::classify(db.as_ref()),
        _ => Fault::Other,
    }
}

fn typed(operation: &'static str, fault: Fault, error: sqlx::Error) -> Error {
    match fault {
        Fault::Unavailable => Error::Unavailable {
            source: Box::new(error),
        },
        Fault::SchemaMissing | Fault::Other => Error::Database {
            operation,
            source: Box::new(error),
        },
    }
}
