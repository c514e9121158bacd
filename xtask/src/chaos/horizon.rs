//! A held cleanup horizon through the relay scenario, as production has one: a snapshot
//! transaction that has read the outbox's tables (as `pg_dump` or a long report does, or on
//! MariaDB `mysqldump --single-transaction`) stays open while relays are killed and the server
//! restarts, so every acknowledged row stays behind, dead, for the whole run. After a restart
//! it is opened again.

use std::time::Duration;

use sqlx::{Connection, MySqlConnection, PgConnection};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Backend;

/// The statements that open the snapshot and read the outbox with it.
fn opening(backend: Backend) -> &'static [&'static str] {
    match backend {
        Backend::Postgres => &[
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "SELECT count(*) FROM outbox_messages",
            "SELECT count(*) FROM outbox_shards",
            "SELECT count(*) FROM outbox_leases",
        ],
        Backend::Mariadb => &[
            "START TRANSACTION WITH CONSISTENT SNAPSHOT",
            "SELECT count(*) FROM outbox_messages",
            "SELECT count(*) FROM outbox_shards",
        ],
        Backend::Sqlite => &[],
    }
}

/// The holder running beside the relays.
pub(crate) struct Holder {
    stop: watch::Sender<bool>,
    task: JoinHandle<Duration>,
}

impl Holder {
    /// Starts holding the horizon of the database at `url` (none on SQLite, whose readers
    /// hold no horizon of this kind).
    pub(crate) fn start(backend: Backend, url: &str) -> Option<Self> {
        if backend == Backend::Sqlite {
            return None;
        }
        let (stop, stopping) = watch::channel(false);
        let url = url.to_owned();
        let task = tokio::spawn(async move {
            match backend {
                Backend::Postgres => hold::<PgConnection>(&url, backend, stopping).await,
                _ => hold::<MySqlConnection>(&url, backend, stopping).await,
            }
        });
        Some(Self { stop, task })
    }

    /// Ends the snapshot: how long the horizon was held in all.
    pub(crate) async fn stop(self) -> Duration {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// Holds a snapshot open until `stopping`, opening it again whenever the connection breaks
/// (a server restart): the time it was held.
async fn hold<C>(url: &str, backend: Backend, mut stopping: watch::Receiver<bool>) -> Duration
where
    C: Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let mut held = Duration::ZERO;
    // Until asked to stop, or the holder is gone.
    while !*stopping.borrow() && stopping.has_changed().is_ok() {
        let Ok(mut conn) = C::connect(url).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut open = true;
        for &statement in opening(backend) {
            open &= sqlx::raw_sql(statement).execute(&mut conn).await.is_ok();
        }
        if !open {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let since = Instant::now();
        loop {
            tokio::select! {
                _ = stopping.changed() => break,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            if sqlx::raw_sql("SELECT 1").execute(&mut conn).await.is_err() {
                break;
            }
        }
        held += since.elapsed();
        let _ = conn.close().await;
    }
    held
}
