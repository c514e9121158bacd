use outbox_core::Error;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlConnectOptions;

use crate::dialect::MySqlDialect;

/// Opens a pool on the MariaDB or MySQL database at `url` (`mysql://user:password@host:port/database`,
/// or `mariadb://`).
///
/// A URL of another scheme (`postgres://`, `sqlite:`) or one that does not parse is an
/// [`Error::InvalidDatabaseUrl`] naming what is wrong (never the password), as is a password
/// given as a query parameter (the driver reads it only in the user-info); a server that does
/// not answer within five seconds is an [`Error::Unavailable`]. The pool has 20 connections:
/// the relay drains 16 shards at once by default, each on a connection of its own. For other
/// pool settings, build the pool with `sqlx`'s `MySqlPoolOptions` yourself: the outbox's
/// statements set what they need (their transactions' isolation) themselves.
pub async fn connect(url: &str) -> Result<MySqlPool, Error> {
    outbox_sqlx::connect::check_scheme(url, "MariaDB", &["mysql", "mariadb"])?;
    // sqlx reads a password in the user-info only, and ignores any parameter it does not know.
    outbox_sqlx::connect::refuse_unread_secrets(
        url,
        &[],
        "in the user-info: `mysql://user:password@host/database`",
    )?;
    // sqlx reads `mysql://` only.
    let url_for_driver = match url.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("mariadb") => format!("mysql:{rest}"),
        _ => url.to_owned(),
    };
    let options: MySqlConnectOptions = url_for_driver
        .parse()
        .map_err(|error: sqlx::Error| Error::invalid_database_url(url, error.to_string()))?;
    outbox_sqlx::connect::pool::<MySqlDialect>(options, "connecting to MariaDB").await
}

// Operators' tools (the `outbox` command) open `mysql://` and `mariadb://` URLs here.
inventory::submit! {
    outbox_core::admin::Backend {
        name: "MariaDB",
        schemes: &["mysql", "mariadb"],
        open: open_for_tools,
        migration_script: outbox_sqlx::migrate::script::<MySqlDialect>,
    }
}

/// Opens the database at `url` for an operator's tool (a MariaDB database always exists
/// before its first migration).
fn open_for_tools(url: String, _open: outbox_core::admin::Open) -> outbox_core::admin::Opening {
    Box::pin(async move {
        let pool = connect(&url).await?;
        Ok(Box::new(crate::MySqlStore::new(pool)) as Box<dyn outbox_core::admin::Database>)
    })
}
