use outbox_core::Error;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::dialect::PgDialect;

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
    outbox_sqlx::connect::check_scheme(url, "PostgreSQL", &["postgres", "postgresql"])?;
    // sqlx reads `password` and logs any parameter it does not know, value and all.
    outbox_sqlx::connect::refuse_unread_secrets(
        url,
        &["password"],
        "in the user-info or as `password=`",
    )?;
    let options: PgConnectOptions = url
        .parse()
        .map_err(|error: sqlx::Error| Error::invalid_database_url(url, error.to_string()))?;
    outbox_sqlx::connect::pool::<PgDialect>(options, "connecting to PostgreSQL").await
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
