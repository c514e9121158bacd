//! Wake-ups across processes: a `NOTIFY` sent after an [`OutboxTransaction`](crate::OutboxTransaction)
//! commits, outside it and coalesced per process, heard through `LISTEN`.
//!
//! The writers' transactions queue no `NOTIFY`: PostgreSQL commits every transaction that did
//! one after another (behind one lock, held through the commit's WAL flush), which would halve
//! the commit rate of many concurrent writers. Instead, once a transaction has committed, this
//! process sends one `NOTIFY` on a pooled connection, naming the shards written since its last
//! one; while one is in flight, the announcements wait and go in the next.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::store::{Wakeup, WakeupStream};
use outbox_core::{Error, ShardKey};
use outbox_sqlx::error::database;
use outbox_sqlx::wake::{Announced, process_nonce};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tracing::debug;

use super::{PgDialect, shard_from_stored, stored_shard};

/// The channel on which committed messages are announced to relays (by this library after
/// commit, and by the trigger [`enable_commit_trigger`](crate::enable_commit_trigger) installs).
pub const NOTIFY_CHANNEL: &str = "outbox_messages";

/// A notification names at most this many shards; more are sent as `*` (any).
const MOST_SHARDS: usize = 20;

/// The identity of the database a pool connects to.
pub(crate) fn database_key(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

/// Announcements waiting for this process's next `NOTIFY` to a database.
#[derive(Debug, Default)]
struct Outgoing {
    waiting: Announced,
    /// Whether a task is sending (it takes what waits here before it stops).
    sending: bool,
    /// When the last one was sent.
    sent_at: Option<tokio::time::Instant>,
}

/// The shortest time between two of this process's `NOTIFY`s to one database, in
/// microseconds; `u64::MAX`: none are sent.
static ANNOUNCE_INTERVAL: AtomicU64 = AtomicU64::new(0);

/// One announcement: a `NOTIFY` in a transaction of its own that does not wait for its commit
/// to reach the disk. It announces commits that are on disk already, and a crash that loses it
/// loses nothing the relays' polling does not find.
const ANNOUNCE: &str = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)";

/// Sets how often, at most, this process announces its [`OutboxTransaction`](crate::OutboxTransaction)s'
/// commits to the relays of other processes, with one `NOTIFY` per database naming every shard
/// committed since the last.
///
/// By default (no interval), a commit is announced at once unless an announcement is in
/// flight; those made meanwhile go together in the next, so a process sends at most one
/// `NOTIFY` per round trip to the database however fast it commits, and a relay in another
/// process hears of a commit within about one round trip. An interval spaces the `NOTIFY`s
/// out further: the first commit after a quiet spell is still announced at once, those that
/// follow within the interval wait for the next (each `NOTIFY` costs the database about as
/// much as a small transaction that does not wait for the disk). `None` sends none: for
/// deployments whose relays all run in the writers' processes (woken directly), or that are
/// content with the relays' polling.
pub fn set_announce_interval(interval: Option<Duration>) {
    let micros = interval.map_or(u64::MAX, |interval| {
        u64::try_from(interval.as_micros()).unwrap_or(u64::MAX - 1)
    });
    ANNOUNCE_INTERVAL.store(micros, Ordering::Relaxed);
}

/// This process's outgoing announcements, per database.
static OUTGOING: LazyLock<Mutex<HashMap<String, Arc<Mutex<Outgoing>>>>> =
    LazyLock::new(Mutex::default);

/// Sends, after a commit, a `NOTIFY` naming `shards` (empty: any) to the relays of other
/// processes: by a task on the current runtime, coalesced with the announcements made while
/// one is in flight. Without a runtime, or if sending fails, the relays' polling finds the
/// messages.
pub(crate) fn notify(pool: &PgPool, database: &str, shards: &[ShardKey]) {
    let interval = ANNOUNCE_INTERVAL.load(Ordering::Relaxed);
    if interval == u64::MAX {
        return;
    }
    let interval = Duration::from_micros(interval);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let outgoing = {
        let mut databases = OUTGOING.lock().unwrap_or_else(PoisonError::into_inner);
        match databases.get(database) {
            Some(outgoing) => Arc::clone(outgoing),
            None => Arc::clone(databases.entry(database.to_owned()).or_default()),
        }
    };
    {
        let mut outgoing = outgoing.lock().unwrap_or_else(PoisonError::into_inner);
        outgoing.waiting.add(shards);
        if std::mem::replace(&mut outgoing.sending, true) {
            return;
        }
    }
    let (pool, database) = (pool.clone(), database.to_owned());
    runtime.spawn(async move {
        // Cleared if the task is dropped mid-send (its runtime shutting down).
        let mut sender = Sending(Some(Arc::clone(&outgoing)));
        loop {
            let next = outgoing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .sent_at
                .map(|sent| sent + interval);
            if let Some(next) = next {
                tokio::time::sleep_until(next).await;
            }
            let payload = {
                let mut outgoing = outgoing.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(wakeup) = outgoing.waiting.take() else {
                    // Under the lock: an announcement made after this starts a new task.
                    outgoing.sending = false;
                    sender.0 = None;
                    break;
                };
                outgoing.sent_at = Some(tokio::time::Instant::now());
                payload(&database, &wakeup)
            };
            if let Err(error) = sqlx::query(ANNOUNCE)
                .bind(NOTIFY_CHANNEL)
                .bind(payload)
                .execute(&pool)
                .await
            {
                debug!(%error, "announcing committed messages to other processes failed; their relays will poll");
            }
        }
    });
}

/// Marks the database's announcements as no longer being sent if the task sending them is
/// dropped before it is done.
struct Sending(Option<Arc<Mutex<Outgoing>>>);

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some(outgoing) = &self.0 {
            outgoing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .sending = false;
        }
    }
}

/// A notification's text: `@` this process's nonce and the database, then one
/// `scope:shard:destination` per line, or `*` (any).
fn payload(database: &str, wakeup: &Wakeup) -> String {
    let mut text = format!("@{:016x} {database}", process_nonce());
    match wakeup {
        Wakeup::Shards(shards) if shards.len() <= MOST_SHARDS => {
            for shard in shards {
                let (identifier, destination) = stored_shard(shard);
                let _ = write!(text, "\n{}:{identifier}:{destination}", shard.scope.0);
            }
        }
        _ => text.push_str("\n*"),
    }
    text
}

/// Commit notifications from other processes, through `LISTEN`.
#[derive(Debug)]
pub struct PgWakeups {
    listener: PgListener,
    /// What starts this process's own notifications to this database, which the relay has
    /// heard directly already.
    own: String,
}

impl PgWakeups {
    /// Listens on [`NOTIFY_CHANNEL`] with a connection of its own.
    pub(crate) async fn listen(pool: &PgPool) -> Result<Self, Error> {
        let mut listener = PgListener::connect_with(pool)
            .await
            .map_err(database::<PgDialect>("listening for commits"))?;
        listener
            .listen(NOTIFY_CHANNEL)
            .await
            .map_err(database::<PgDialect>("listening for commits"))?;
        let own = format!("@{:016x} {}", process_nonce(), database_key(pool));
        Ok(Self { listener, own })
    }
}

impl WakeupStream for PgWakeups {
    async fn next(&mut self) -> Result<Wakeup, Error> {
        loop {
            match self.listener.try_recv().await {
                Ok(Some(notification)) => {
                    let payload = notification.payload();
                    let (sender, shards) = match payload.strip_prefix('@') {
                        Some(_) => payload.split_once('\n').unwrap_or((payload, "")),
                        None => ("", payload),
                    };
                    if sender == self.own {
                        continue;
                    }
                    return Ok(parse_wakeup(shards));
                }
                // The connection was lost and has been re-established (listening again):
                // commits in between went unannounced, so the relay should look for itself.
                Ok(None) => return Ok(Wakeup::Any),
                Err(error) => return Err(database::<PgDialect>("listening for commits")(error)),
            }
        }
    }
}

/// Parses a notification's shards: one `scope:shard:destination` per line, or `*`.
fn parse_wakeup(payload: &str) -> Wakeup {
    let mut shards = Vec::new();
    for line in payload.lines() {
        let mut parts = line.splitn(3, ':');
        let parsed = match (parts.next(), parts.next(), parts.next()) {
            (Some(scope), Some(shard), Some(destination)) => scope
                .parse::<i16>()
                .ok()
                .zip(shard.parse::<i64>().ok())
                .and_then(|(scope, shard)| {
                    shard_from_stored(scope, shard, destination.to_owned()).ok()
                }),
            _ => None,
        };
        match parsed {
            Some(key) => shards.push(key),
            None => return Wakeup::Any,
        }
    }
    if shards.is_empty() {
        Wakeup::Any
    } else {
        Wakeup::Shards(shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{Destination, Id, ScopeId, ShardKey};

    #[test]
    fn parses_notification_payloads() {
        assert_eq!(parse_wakeup("*"), Wakeup::Any);
        assert_eq!(parse_wakeup(""), Wakeup::Any);
        assert_eq!(
            parse_wakeup(
                "1:42:\n2:-7:eu:west\n3:9223372036854775807:\u{1}000000000000000000000000000000ffus"
            ),
            Wakeup::Shards(vec![
                ShardKey::local(ScopeId(1), 42),
                ShardKey::fan_out(ScopeId(2), -7, Destination::new("eu:west").unwrap()),
                ShardKey::fan_out(ScopeId(3), Id::wide(255), Destination::new("us").unwrap()),
            ])
        );
        assert_eq!(
            parse_wakeup("1:9223372036854775807:\u{1}00ff"),
            Wakeup::Any,
            "a wide shard's destination cut short"
        );
        assert_eq!(parse_wakeup("1:not-a-number:"), Wakeup::Any);
    }
}
