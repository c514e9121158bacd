use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use outbox_core::Error;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use outbox_sqlx::error::database;

use crate::dialect::SqliteDialect;

/// The size the write-ahead log is cut back to when it starts over ([`connect_options`]):
/// about what a thousand pages, SQLite's automatic checkpoint, fill.
pub const WAL_SIZE_LIMIT: u64 = 4 << 20;

/// Options for a database file suited to the outbox: created if missing, WAL journal (readers
/// never block the writer), `synchronous = NORMAL` (durable at each WAL checkpoint, safe with
/// WAL), a 10 s busy timeout so concurrent writers wait for each other instead of failing,
/// and the write-ahead log cut back to [`WAL_SIZE_LIMIT`] each time it starts over.
///
/// A reader whose transaction stays open (a backup, a report) keeps every checkpoint from
/// passing its snapshot, and the log grows with every commit until it ends: by tens of
/// kilobytes a message, gigabytes in minutes at hundreds of messages a second. Without the
/// limit SQLite keeps the file at that size after; with it, the next write after the log has
/// been checkpointed whole cuts the file back.
pub fn connect_options(path: &Path) -> SqliteConnectOptions {
    outbox_settings(SqliteConnectOptions::new().filename(path))
}

fn outbox_settings(options: SqliteConnectOptions) -> SqliteConnectOptions {
    options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
        .pragma("journal_size_limit", WAL_SIZE_LIMIT.to_string())
}

/// Opens a pool on the database file at `path` with [`connect_options`].
///
/// `path` is a file path, or a `sqlite:` URL (`sqlite://outbox.db`, `sqlite:outbox.db`; its
/// options go under the outbox's, which [`connect_options`] lists). Any other URL
/// (`postgres://`, `mysql://`) is an [`Error::InvalidDatabaseUrl`] naming its scheme (never
/// the rest, which may hold a password), not a file of that name.
pub async fn connect(path: &Path) -> Result<SqlitePool, Error> {
    pool_with(options_at(path)?).await
}

/// The options [`connect`] opens `path` with: a file path's, or a `sqlite:` URL's under the
/// outbox's.
fn options_at(path: &Path) -> Result<SqliteConnectOptions, Error> {
    Ok(match url_scheme(path) {
        None => connect_options(path),
        Some(scheme) if scheme.eq_ignore_ascii_case("sqlite") => {
            let url = path.to_str().unwrap_or_default();
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|error| Error::invalid_database_url(url, error.to_string()))?;
            outbox_settings(options)
        }
        Some(scheme) => {
            return Err(Error::invalid_database_url(
                path.to_str().unwrap_or_default(),
                format!(
                    "the scheme `{scheme}:` is not SQLite's: expected a file path or a \
                     `sqlite:` URL{}",
                    outbox_sqlx::connect::opener_of(scheme)
                        .map(|opener| format!(" (that database opens with `{opener}`)"))
                        .unwrap_or_default()
                ),
            ));
        }
    })
}

/// A pool on the database `options` name.
async fn pool_with(options: SqliteConnectOptions) -> Result<SqlitePool, Error> {
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .map_err(database::<SqliteDialect>("connecting to SQLite"))
}

/// The scheme of `path` if it is a URL: `sqlite:` followed by anything, or any scheme followed
/// by `://`.
fn url_scheme(path: &Path) -> Option<&str> {
    let text = path.to_str()?;
    let (scheme, rest) = text.split_once(':')?;
    let is_scheme = scheme.len() > 1
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (is_scheme && (scheme.eq_ignore_ascii_case("sqlite") || rest.starts_with("//")))
        .then_some(scheme)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::url_scheme;

    #[test]
    fn urls_are_told_from_paths() {
        assert_eq!(url_scheme(Path::new("outbox.db")), None);
        assert_eq!(url_scheme(Path::new("/var/lib/app/outbox.db")), None);
        assert_eq!(url_scheme(Path::new("C:/data/outbox.db")), None);
        assert_eq!(url_scheme(Path::new("sqlite://outbox.db")), Some("sqlite"));
        assert_eq!(url_scheme(Path::new("sqlite:outbox.db")), Some("sqlite"));
        assert_eq!(
            url_scheme(Path::new("postgres://app:secret@db/x")),
            Some("postgres")
        );
    }
}

// Operators' tools (the `outbox` command) open `sqlite:` URLs here.
inventory::submit! {
    outbox_core::admin::Backend {
        name: "SQLite",
        schemes: &["sqlite"],
        open: open_for_tools,
        migration_script: outbox_sqlx::migrate::script::<SqliteDialect>,
    }
}

/// Opens the database file at the `sqlite:` URL `url` for an operator's tool: a file that is
/// not there is an error, unless `open` allows creating it (a first migration does).
fn open_for_tools(url: String, open: outbox_core::admin::Open) -> outbox_core::admin::Opening {
    Box::pin(async move {
        let options = options_at(Path::new(&url))?;
        let file = options.get_filename();
        if open == outbox_core::admin::Open::Existing && !file.exists() {
            return Err(Error::invalid_database_url(
                &url,
                format!(
                    "no database file at {}: check the URL (`outbox migrate` creates one)",
                    file.display()
                ),
            ));
        }
        let pool = pool_with(options).await?;
        Ok(Box::new(crate::SqliteStore::new(pool)) as Box<dyn outbox_core::admin::Database>)
    })
}
