use std::time::Duration;

use outbox_core::Error;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use outbox_sqlx::error::database;

use crate::dialect::PgDialect;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a pool on the PostgreSQL database at `url` (`postgres://user@host:port/database`, or
/// `postgresql://`).
///
/// A URL of another scheme (`postgress://`, `mysql://`, `sqlite:`) or one that does not parse
/// is an [`Error::InvalidDatabaseUrl`] naming what is wrong (never the password); a URL asking
/// for TLS (`sslmode=require`) on a build of sqlx without TLS, or a TLS set-up that fails, is
/// an [`Error::InvalidConfig`]; neither is worth retrying. A server that does not answer
/// within five seconds is an [`Error::Unavailable`]. The pool has 20 connections: the relay
/// drains 16 shards at once by default, each on a connection of its own. For other pool
/// settings, build the pool with `sqlx`'s `PgPoolOptions` yourself: the outbox needs nothing
/// special of it.
pub async fn connect(url: &str) -> Result<PgPool, Error> {
    check_scheme(url)?;
    // sqlx reads `password` and logs any parameter it does not know, value and all.
    if let Some(unread) = outbox_core::admin::secret_parameters(url)
        .into_iter()
        .find(|key| key != "password")
    {
        return Err(Error::invalid_database_url(
            url,
            format!(
                "the parameter `{unread}` is not one the driver reads (a password goes in the \
                 user-info or as `password=`): remove it"
            ),
        ));
    }
    let options: PgConnectOptions = url
        .parse()
        .map_err(|error: sqlx::Error| Error::invalid_database_url(url, error.to_string()))?;
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

/// Refuses a URL that is not PostgreSQL's: sqlx would read `postgress://` or `mysql://` as a
/// PostgreSQL address, and fail (or connect) far from the typo.
fn check_scheme(url: &str) -> Result<(), Error> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme)
        .filter(|scheme| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
    match scheme {
        Some(scheme)
            if scheme.eq_ignore_ascii_case("postgres")
                || scheme.eq_ignore_ascii_case("postgresql") =>
        {
            Ok(())
        }
        Some(scheme) => Err(Error::invalid_database_url(
            url,
            format!(
                "the scheme `{scheme}:` is not PostgreSQL's: expected `postgres://` or \
                 `postgresql://`{}",
                if scheme.eq_ignore_ascii_case("sqlite") {
                    " (a SQLite database opens with `outbox_sqlite::connect`)"
                } else {
                    ""
                }
            ),
        )),
        None => Err(Error::invalid_database_url(
            url,
            "expected a URL beginning `postgres://` or `postgresql://`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::check_scheme;

    #[test]
    fn only_postgres_schemes_are_accepted() {
        for url in [
            "postgres://app@db/x",
            "postgresql://app@db/x",
            "POSTGRES://app@db/x",
        ] {
            assert!(check_scheme(url).is_ok(), "{url}");
        }
        for (url, scheme) in [
            ("postgress://app:secret@db/x", "postgress:"),
            ("mysql://app:secret@db/x", "mysql:"),
            ("sqlite://outbox.db", "sqlite:"),
        ] {
            let error = check_scheme(url).expect_err(url).to_string();
            assert!(
                error.contains(&format!("`{scheme}`")) && error.contains("`postgres://`"),
                "{error}"
            );
            assert!(!error.contains("secret"), "{error}");
        }
        assert!(check_scheme("not a url").is_err());
    }
}

// Operators' tools (the `outbox` command) open `postgres://` and `postgresql://` URLs here.
inventory::submit! {
    outbox_core::admin::Backend {
        name: "PostgreSQL",
        schemes: &["postgres", "postgresql"],
        open: open_for_tools,
        migration_script: outbox_sqlx::migrate::script::<PgDialect>,
    }
}

/// Opens the database at `url` for an operator's tool (a PostgreSQL database always exists
/// before its first migration).
fn open_for_tools(url: String, _open: outbox_core::admin::Open) -> outbox_core::admin::Opening {
    Box::pin(async move {
        let pool = connect(&url).await?;
        Ok(Box::new(crate::PgStore::new(pool)) as Box<dyn outbox_core::admin::Database>)
    })
}
