//! Opening a pool on a server database: what every server backend's `connect` does the same
//! way (the URL's scheme checked before the driver reads it, one probing connection, then the
//! pool).

use std::time::Duration;

use outbox_core::Error;
use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database, Pool};

use crate::dialect::Dialect;
use crate::error::database;

/// How long a server has to answer a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The connections of the pool `connect` opens: the relay drains 16 shards at once by
/// default, each on a connection of its own.
pub const POOL_SIZE: u32 = 20;

/// Each backend's URL schemes and the function that opens them: what a URL of another
/// backend's scheme is told to use.
const OPENERS: [(&[&str], &str); 3] = [
    (&["postgres", "postgresql"], "outbox_postgres::connect"),
    (&["mysql", "mariadb"], "outbox_mysql::connect"),
    (&["sqlite"], "outbox_sqlite::connect"),
];

/// The function that opens a URL of `scheme` (`outbox_postgres::connect` for `postgres`), if
/// a backend of the outbox reads that scheme.
pub fn opener_of(scheme: &str) -> Option<&'static str> {
    OPENERS
        .iter()
        .find(|(schemes, _)| schemes.iter().any(|s| scheme.eq_ignore_ascii_case(s)))
        .map(|(_, opener)| *opener)
}

/// Refuses a URL whose scheme is not one of `schemes` (the database `name`'s): a driver would
/// read `postgress://` or another backend's URL as its own, and fail (or connect) far from the
/// typo. The error names the scheme and what is expected, never the rest of the URL, and the
/// function that opens another backend's URL. A URL with no `//` after its scheme
/// (`mysql:user:password@host/db`) is refused too: a driver reads all of it as the
/// database's name, and the server's error then quotes it, password and all.
pub fn check_scheme(url: &str, name: &str, schemes: &[&str]) -> Result<(), Error> {
    let expected = schemes
        .iter()
        .map(|scheme| format!("`{scheme}://`"))
        .collect::<Vec<_>>()
        .join(" or ");
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
        Some(scheme) if schemes.iter().any(|own| scheme.eq_ignore_ascii_case(own)) => {
            if url[scheme.len() + 1..].starts_with("//") {
                Ok(())
            } else {
                Err(Error::invalid_database_url(
                    url,
                    format!(
                        "`{scheme}:` is not followed by `//`: expected a URL beginning {expected}"
                    ),
                ))
            }
        }
        Some(scheme) => {
            let elsewhere = opener_of(scheme)
                .map(|opener| format!(" (that database opens with `{opener}`)"))
                .unwrap_or_default();
            Err(Error::invalid_database_url(
                url,
                format!("the scheme `{scheme}:` is not {name}'s: expected {expected}{elsewhere}"),
            ))
        }
        None => Err(Error::invalid_database_url(
            url,
            format!("expected a URL beginning {expected}"),
        )),
    }
}

/// Refuses a URL with a secret query parameter (`password`, `sslpassword`, `…token`…) that the
/// driver does not read (`read`: those it does), or one hidden behind a stray `?` in another
/// parameter's value: a driver logs a parameter it does not know, value and all, or ignores
/// it. `hint` says where a password goes instead.
pub fn refuse_unread_secrets(url: &str, read: &[&str], hint: &str) -> Result<(), Error> {
    match outbox_core::admin::secret_parameters(url)
        .into_iter()
        .find(|key| !read.contains(&key.as_str()))
    {
        Some(unread) => Err(Error::invalid_database_url(
            url,
            format!(
                "the parameter `{unread}` holds a secret the driver does not read (a password \
                 goes {hint}; parameters are joined with `&`): remove it"
            ),
        )),
        None => Ok(()),
    }
}

/// A pool of [`POOL_SIZE`] connections on the server `options` name, after one direct
/// connection has answered within [`CONNECT_TIMEOUT`] (a pool would retry a refused
/// connection until its timeout and then report only the timeout, not why). `operation`
/// names the connection in errors ("connecting to PostgreSQL").
pub async fn pool<D: Dialect>(
    options: <<D::Database as Database>::Connection as Connection>::Options,
    operation: &'static str,
) -> Result<Pool<D::Database>, Error> {
    let connecting = || database::<D>(operation);
    let probe = tokio::time::timeout(
        CONNECT_TIMEOUT,
        <D::Database as Database>::Connection::connect_with(&options),
    )
    .await
    .map_err(|_| Error::Unavailable {
        source: format!("no answer from {} within {CONNECT_TIMEOUT:?}", D::NAME).into(),
    })?
    .map_err(connecting())?;
    let _ = probe.close().await;
    PoolOptions::<D::Database>::new()
        .max_connections(POOL_SIZE)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(connecting())
}

#[cfg(test)]
mod tests {
    use super::check_scheme;

    #[test]
    fn only_the_backends_schemes_are_accepted() {
        let postgres = ["postgres", "postgresql"];
        for url in [
            "postgres://app@db/x",
            "postgresql://app@db/x",
            "POSTGRES://app@db/x",
        ] {
            assert!(check_scheme(url, "PostgreSQL", &postgres).is_ok(), "{url}");
        }
        for (url, scheme, opener) in [
            ("postgress://app:secret@db/x", "postgress:", None),
            (
                "mysql://app:secret@db/x",
                "mysql:",
                Some("outbox_mysql::connect"),
            ),
            (
                "sqlite://outbox.db",
                "sqlite:",
                Some("outbox_sqlite::connect"),
            ),
        ] {
            let error = check_scheme(url, "PostgreSQL", &postgres)
                .expect_err(url)
                .to_string();
            assert!(
                error.contains(&format!("`{scheme}`")) && error.contains("`postgres://`"),
                "{error}"
            );
            assert!(!error.contains("secret"), "{error}");
            if let Some(opener) = opener {
                assert!(error.contains(opener), "{error}");
            }
        }
        assert!(check_scheme("not a url", "PostgreSQL", &postgres).is_err());
        for url in ["postgres:app:secret@db/x", "postgresql:/app:secret@db/x"] {
            let error = check_scheme(url, "PostgreSQL", &postgres)
                .expect_err(url)
                .to_string();
            assert!(error.contains("not followed by `//`"), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
        let mariadb = check_scheme(
            "postgres://app:secret@db/x",
            "MariaDB",
            &["mysql", "mariadb"],
        )
        .expect_err("a PostgreSQL URL")
        .to_string();
        assert!(
            mariadb.contains("`mysql://` or `mariadb://`")
                && mariadb.contains("outbox_postgres::connect"),
            "{mariadb}"
        );
    }
}
