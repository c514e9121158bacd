use std::time::Duration;

use outbox_core::Error;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use outbox_sqlx::error::database;

use crate::dialect::PgDialect;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a pool on the PostgreSQL database at `url` (`postgres://user@host:port/database`).
///
/// A URL that does not parse is an [`Error::InvalidDatabaseUrl`]; a server that does not
/// answer within five seconds is an [`Error::Unavailable`]. The pool has 20 connections: the
/// relay drains 16 shards at once by default, each on a connection of its own. For other pool
/// settings, build the pool with `sqlx`'s `PgPoolOptions` yourself: the outbox needs nothing
/// special of it.
pub async fn connect(url: &str) -> Result<PgPool, Error> {
    let options: PgConnectOptions =
        url.parse()
            .map_err(|error: sqlx::Error| Error::InvalidDatabaseUrl {
                url: redact(url),
                reason: error.to_string(),
            })?;
    // One direct connection first: the pool would retry a refused connection until its
    // timeout and then report only the timeout, not why.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
        .await
        .map_err(|_| Error::Unavailable {
            source: format!("no answer from PostgreSQL within {CONNECT_TIMEOUT:?}").into(),
        })?
        .map_err(database::<PgDialect>("connecting to PostgreSQL"))?;
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(20)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(database::<PgDialect>("connecting to PostgreSQL"))
}

/// The URL without its password, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &credentials[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://app:secret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(redact("not a url"), "not a url");
    }
}
