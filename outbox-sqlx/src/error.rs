//! Driver errors as the outbox's typed errors.

use outbox_core::Error;

use outbox_core::error::error_chain;

use crate::dialect::{Dialect, Fault};

/// Maps a driver error on the outbox's own tables: connectivity (the connection, the pool, or
/// the server saying it is going away) to [`Error::Unavailable`], a missing outbox table or
/// column to [`Error::MigrationMissing`], a connection that cannot work as configured (TLS
/// asked for on a build without it, say) to [`Error::InvalidConfig`], anything else to
/// [`Error::Database`]. Only [`Error::Unavailable`] is worth retrying.
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
        // A TLS error made of an I/O error is the network's; any other (no TLS in this build,
        // a certificate that does not verify, a server without TLS) is the configuration's.
        sqlx::Error::Tls(source) if caused_by_io(source.as_ref()) => Fault::Unavailable,
        sqlx::Error::Tls(_) | sqlx::Error::Configuration(_) => Fault::Configuration,
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Fault::Unavailable,
        sqlx::Error::Database(db) => D::classify(db.as_ref()),
        _ => Fault::Other,
    }
}

/// Whether `error` or one of its causes is an I/O error.
fn caused_by_io(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<std::io::Error>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A driver error as the outbox shows it: a database's own error by its message and code,
/// without the server's source-file line that `sqlx` appends to PostgreSQL's (`at line 948`,
/// a line of PostgreSQL's C code, of no use to an operator); any other error as `sqlx` says
/// it. The `sqlx` error is kept: [`DriverError::sqlx`].
#[derive(Debug)]
pub struct DriverError(sqlx::Error);

impl DriverError {
    /// Wraps a driver error.
    pub fn new(error: sqlx::Error) -> Self {
        Self(error)
    }

    /// The driver's error, for its code or kind.
    pub fn sqlx(&self) -> &sqlx::Error {
        &self.0
    }

    /// The driver's error.
    pub fn into_sqlx(self) -> sqlx::Error {
        self.0
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            sqlx::Error::Database(db) => {
                f.write_str(db.message())?;
                match db.code() {
                    Some(code) => write!(f, " (code {code})"),
                    None => Ok(()),
                }
            }
            other => other.fmt(f),
        }
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            // The database's error is the message itself: its Display is what is shown above.
            sqlx::Error::Database(_) => None,
            other => other.source(),
        }
    }
}

fn typed(operation: &'static str, fault: Fault, error: sqlx::Error) -> Error {
    let error = DriverError(error);
    match fault {
        Fault::Unavailable => Error::Unavailable {
            source: Box::new(error),
        },
        Fault::Configuration => {
            let (setting, problem) = match error.sqlx() {
                sqlx::Error::Tls(_) => ("TLS", "cannot be set up for the database connection"),
                _ => ("connection options", "are refused by the database driver"),
            };
            Error::InvalidConfig {
                setting,
                problem: format!("{problem} while {operation}: {}", error_chain(&error)),
            }
        }
        Fault::Unsupported { store, feature } => {
            tracing::error!(store, feature, error = %error, "the database lacks what the outbox needs");
            Error::Unsupported { store, feature }
        }
        Fault::SchemaMissing | Fault::Other => Error::Database {
            operation,
            source: Box::new(error),
        },
    }
}
