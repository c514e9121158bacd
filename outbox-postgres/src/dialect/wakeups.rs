//! Wake-ups across processes: a `NOTIFY` sent after an [`OutboxTransaction`](crate::OutboxTransaction)
//! commits, outside it and coalesced per process, heard through `LISTEN`.
//!
//! The writers' transactions queue no `NOTIFY`: PostgreSQL commits every transaction that did
//! one after another (behind one lock, held through the commit's WAL flush), which would halve
//! the commit rate of many concurrent writers. Instead, once a transaction has committed, this
//! process sends one `NOTIFY`, naming the shards written since its last one; while one is in
//! flight, the announcements wait and go in the next. It goes on a connection of its own (one
//! per process and database, opened at the first announcement), never one of the writers'
//! pool: a busy pool would make it wait for a writer, and each connection a pool lends is
//! first tested with a round trip.
//!
//! Nor does it send one that nobody would hear. A relay's `LISTEN` connection names itself
//! (its `application_name` is [`listener_name`] of its process and database), so that a
//! process can tell from `pg_stat_activity` whether a relay of *another* process listens: a
//! relay of its own is woken directly, and a `NOTIFY` it alone would hear is a transaction
//! spent for nothing (at one writer, 70% of plain SQL's commit rate with it, 88% without).
//! What it read is kept for [`LISTENERS_KNOWN_FOR`]: a relay of another process that starts
//! listening hears this process's commits within that (and finds those made before by its
//! sweep and polling).
//! A listener that does not name itself (a relay of an earlier version, a program of the
//! user's) counts while `LISTEN` is the last statement it ran.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::store::{Wakeup, WakeupStream};
use outbox_core::{Error, ShardKey};
use outbox_sqlx::error::database;
use outbox_sqlx::wake::{Announced, process_nonce};
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
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

/// What a relay's `LISTEN` connection to `database` ([`database_key`]) is named in a process:
/// a digest of the process's nonce and the database, so that this process's writers know it
/// for their own (a relay they wake directly) and every other process's for another's.
fn listener_name(database: &str) -> String {
    let digest = BuildHasherDefault::<DefaultHasher>::default().hash_one(sender(database));
    format!("{LISTENER_PREFIX}{digest:016x}")
}

/// How this process signs what it sends to `database` ([`database_key`]): the first line of
/// its notifications, by which its own relays know them.
fn sender(database: &str) -> String {
    format!("@{:016x} {database}", process_nonce())
}

/// A pool of one connection to `pool`'s database, with its options, named `name` (if any):
/// where a listener's connection comes from, so that its name stays with it when it connects
/// again and goes with it, and where a process's announcements go out
/// ([`notify`]). Its connection is not tested before each use (a round trip to the server):
/// one that broke fails its next statement, and the next use connects anew.
fn listener_pool(pool: &PgPool, name: Option<&str>) -> PgPool {
    let mut options = (*pool.connect_options()).clone();
    if let Some(name) = name {
        options = options.application_name(name);
    }
    PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .test_before_acquire(false)
        .connect_lazy_with(options)
}

/// How the names of relays' `LISTEN` connections begin.
const LISTENER_PREFIX: &str = "outbox-listener ";

/// Whether a relay of another process listens on the database: a connection named as a
/// relay's listener (`$2`: [`LISTENER_PREFIX`] then `%`) but not this process's (`$1`), or one
/// that does not name itself whose last statement was a `LISTEN` on the channel.
const LISTENERS: &str = "\
    SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
        WHERE datname = current_database() AND pid <> pg_backend_pid() \
            AND CASE WHEN application_name LIKE $2 \
                THEN application_name <> $1 \
                ELSE query LIKE 'LISTEN%outbox_messages%' END)";

/// How long what [`LISTENERS`] read is taken for true.
const LISTENERS_KNOWN_FOR: Duration = Duration::from_secs(1);

/// Announcements waiting for this process's next `NOTIFY` to a database.
#[derive(Debug, Default)]
struct Outgoing {
    waiting: Announced,
    /// Whether a task is sending (it takes what waits here before it stops).
    sending: bool,
    /// When the last one was sent.
    sent_at: Option<tokio::time::Instant>,
    /// Whether a relay of another process listened, and when that was read.
    listeners: Option<(bool, tokio::time::Instant)>,
    /// The connection announcements go out on (a [`listener_pool`] of the first writer's
    /// pool): never one a writer waits for, nor one a writer's pool tests before lending it.
    announcer: Option<PgPool>,
}

impl Outgoing {
    /// Whether no relay of another process listened a moment ago: nothing to announce.
    fn unheard(&self) -> bool {
        matches!(self.listeners, Some((false, at)) if at.elapsed() < LISTENERS_KNOWN_FOR)
    }

    /// Whether to read again who listens before the next announcement goes: not yet read, or
    /// not lately. While another process listens the announcement goes first (what was read
    /// is read again after it), so that its relays hear it without a round trip more.
    fn ask_first(&self) -> bool {
        self.stale() && !self.listeners.is_some_and(|(listening, _)| listening)
    }

    /// Whether who listens was not read lately (or ever).
    fn stale(&self) -> bool {
        self.listeners
            .is_none_or(|(_, at)| at.elapsed() >= LISTENERS_KNOWN_FOR)
    }

    /// Until when the next announcement waits, `interval` after the last one, if that is
    /// still to come at `now`. A time already past is no wait at all, not a sleep: the timer
    /// rounds a deadline up to its next millisecond and fires when a worker next turns it,
    /// so that with no interval every announcement but the first waited up to a millisecond
    /// or more on a busy runtime (commit→handler from another process at 1,000 commits/s,
    /// p50 2.31 ms with the sleep and 1.77 ms without: medians of five runs each).
    fn wait_until(
        &self,
        interval: Duration,
        now: tokio::time::Instant,
    ) -> Option<tokio::time::Instant> {
        let next = self.sent_at? + interval;
        (next > now).then_some(next)
    }
}

/// Whether a relay of another process listens on `pool`'s database (`database`); `true` if it
/// cannot be read (an announcement too many costs less than one missed).
async fn listened(pool: &PgPool, database: &str) -> bool {
    sqlx::query_scalar(LISTENERS)
        .bind(listener_name(database))
        .bind(format!("{LISTENER_PREFIX}%"))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|error: sqlx::Error| {
            debug!(%error, "cannot read whether relays of other processes listen; announcing");
            true
        })
}

/// Reads who listens into `outgoing` if `due`.
async fn read_listeners(outgoing: &Mutex<Outgoing>, pool: &PgPool, database: &str, due: bool) {
    if due {
        let listening = listened(pool, database).await;
        outgoing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .listeners = Some((listening, tokio::time::Instant::now()));
    }
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
        if outgoing.unheard() {
            return;
        }
        outgoing.waiting.add(shards);
        if std::mem::replace(&mut outgoing.sending, true) {
            return;
        }
    }
    let (writers, database) = (pool.clone(), database.to_owned());
    runtime.spawn(async move {
        let mut pool = announcer(&outgoing, &writers, false);
        // Cleared if the task is dropped mid-send (its runtime shutting down).
        let mut sender = Sending(Some(Arc::clone(&outgoing)));
        loop {
            let next = outgoing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .wait_until(interval, tokio::time::Instant::now());
            if let Some(next) = next {
                tokio::time::sleep_until(next).await;
            }
            let first = outgoing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .ask_first();
            read_listeners(&outgoing, &pool, &database, first).await;
            let (payload, again) = {
                let mut outgoing = outgoing.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(wakeup) = outgoing.waiting.take() else {
                    // Under the lock: an announcement made after this starts a new task.
                    outgoing.sending = false;
                    sender.0 = None;
                    break;
                };
                if outgoing.unheard() {
                    // Nobody else would hear it; those made meanwhile are dropped as they come.
                    continue;
                }
                outgoing.sent_at = Some(tokio::time::Instant::now());
                (payload(&database, &wakeup), outgoing.stale())
            };
            let mut sent = announce(&pool, &payload).await;
            if sent.is_err() {
                // Its connection may have broken, or belong to a runtime that has ended:
                // once more on a new one.
                pool = announcer(&outgoing, &writers, true);
                sent = announce(&pool, &payload).await;
            }
            if let Err(error) = sent {
                debug!(%error, "announcing committed messages to other processes failed; their relays will poll");
            }
            read_listeners(&outgoing, &pool, &database, again).await;
        }
    });
}

/// The pool of one that `outgoing`'s announcements go out on, made from the writers' `pool`
/// if there is none yet, or `anew`.
fn announcer(outgoing: &Mutex<Outgoing>, pool: &PgPool, anew: bool) -> PgPool {
    let mut outgoing = outgoing.lock().unwrap_or_else(PoisonError::into_inner);
    if anew {
        outgoing.announcer = None;
    }
    outgoing
        .announcer
        .get_or_insert_with(|| listener_pool(pool, None))
        .clone()
}

/// Sends one announcement (`payload`) on `pool`.
async fn announce(pool: &PgPool, payload: &str) -> Result<(), sqlx::Error> {
    sqlx::query(ANNOUNCE)
        .bind(NOTIFY_CHANNEL)
        .bind(payload)
        .execute(pool)
        .await
        .map(drop)
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
    let mut text = sender(database);
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
    /// Listens on [`NOTIFY_CHANNEL`] with a connection of its own, named for this process
    /// ([`listener_name`], from [`listener_pool`]).
    pub(crate) async fn listen(pool: &PgPool) -> Result<Self, Error> {
        let key = database_key(pool);
        let own_pool = listener_pool(pool, Some(&listener_name(&key)));
        let mut listener = PgListener::connect_with(&own_pool)
            .await
            .map_err(database::<PgDialect>("listening for commits"))?;
        listener
            .listen(NOTIFY_CHANNEL)
            .await
            .map_err(database::<PgDialect>("listening for commits"))?;
        Ok(Self {
            listener,
            own: sender(&key),
        })
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

/// Forgets who was read to listen on `database`, as if [`LISTENERS_KNOWN_FOR`] had passed.
#[cfg(test)]
fn forget_listeners(database: &str) {
    if let Some(outgoing) = OUTGOING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(database)
    {
        outgoing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .listeners = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{Destination, Id, ScopeId, ShardKey};
    use outbox_testkit::postgres::PgTestDatabase;

    /// An announcement waits out the interval since the last one, and only a wait still to
    /// come: with no interval, or once a round trip has outlasted it, it goes at once.
    #[test]
    fn an_announcement_waits_only_for_an_interval_still_to_come() {
        let now = tokio::time::Instant::now();
        let sent = |at| Outgoing {
            sent_at: at,
            ..Outgoing::default()
        };
        let ms = Duration::from_millis;
        assert_eq!(
            sent(None).wait_until(ms(5), now),
            None,
            "the first goes at once"
        );
        assert_eq!(sent(Some(now)).wait_until(ms(0), now), None, "no interval");
        assert_eq!(
            sent(Some(now)).wait_until(ms(5), now + ms(7)),
            None,
            "an interval a round trip outlasted"
        );
        assert_eq!(
            sent(Some(now)).wait_until(ms(5), now + ms(2)),
            Some(now + ms(5))
        );
    }

    /// A connection listening on the relays' channel, named `name` (none: as it comes).
    async fn listening(pool: &PgPool, name: Option<&str>) -> PgListener {
        let mut listener = PgListener::connect_with(&listener_pool(pool, name))
            .await
            .expect("connect");
        listener.listen(NOTIFY_CHANNEL).await.expect("listen");
        listener
    }

    /// Announces a commit to shard `shard` after forgetting who listens, and returns what
    /// `spy` (which listens on the channel) heard of it within `within`.
    async fn announced(
        pool: &PgPool,
        spy: &mut PgListener,
        shard: i64,
        within: Duration,
    ) -> Option<String> {
        let database = database_key(pool);
        forget_listeners(&database);
        notify(pool, &database, &[ShardKey::local(ScopeId(1), shard)]);
        tokio::time::timeout(within, spy.recv())
            .await
            .ok()
            .map(|heard| heard.expect("a notification").payload().to_owned())
    }

    /// A commit is announced while a relay of another process listens (one that names itself,
    /// or an earlier version's whose last statement was its `LISTEN`), and not while only
    /// this process's relay does: it is woken directly.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_are_announced_only_while_another_process_listens() {
        let database = PgTestDatabase::create().await;
        let pool = database.pool();
        let database = database_key(pool);
        let mut mine = listening(pool, Some(&listener_name(&database))).await;
        let quiet = Duration::from_millis(300);
        assert_eq!(
            announced(pool, &mut mine, 1, quiet).await,
            None,
            "only this process's relay listens"
        );

        let other = listening(pool, Some("outbox-listener 0000000000000001")).await;
        let heard = announced(pool, &mut mine, 2, Duration::from_secs(10)).await;
        assert!(heard.is_some_and(|heard| heard.ends_with("\n1:2:")));
        drop(other);

        let unnamed = listening(pool, None).await;
        let heard = announced(pool, &mut mine, 3, Duration::from_secs(10)).await;
        assert!(heard.is_some_and(|heard| heard.ends_with("\n1:3:")));
        drop(unnamed);

        // The connections of the dropped listeners close as their pools go.
        let gone = async {
            while listened(pool, &database).await {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("the other listeners went");
        assert_eq!(announced(pool, &mut mine, 4, quiet).await, None);
    }

    /// Announcements go out on a connection of their own: a writers' pool whose every
    /// connection is taken delays none, and one whose connection broke is sent again on a new
    /// one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn announcements_wait_for_no_writer_and_outlive_a_broken_connection() {
        let database = PgTestDatabase::create().await;
        let writers = PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*database.pool().connect_options()).clone())
            .await
            .expect("the writers' pool");
        let key = database_key(&writers);
        let mut other = listening(&writers, Some("outbox-listener 0000000000000001")).await;
        let held = writers
            .acquire()
            .await
            .expect("the writers' only connection");
        let heard = announced(&writers, &mut other, 1, Duration::from_secs(10)).await;
        assert!(
            heard.is_some_and(|heard| heard.ends_with("\n1:1:")),
            "announced while every connection of the writers' pool is taken"
        );

        // The announcer's last statement: the announcement, or the read of who listens that
        // may follow it.
        let ended: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                AND pid <> pg_backend_pid() AND query = ANY($1)",
        )
        .bind([ANNOUNCE, LISTENERS])
        .fetch_all(database.pool())
        .await
        .expect("the announcer's connection");
        assert_eq!(ended.len(), 1, "one connection announces");
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(ended[0])
            .execute(database.pool())
            .await
            .expect("terminate the announcer's connection");
        let gone = async {
            loop {
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                        .bind(ended[0])
                        .fetch_one(database.pool())
                        .await
                        .expect("the announcer's connection");
                if left == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("the announcer's connection ended");
        // Another process listens (as read a moment ago): the announcement goes first, on the
        // broken connection, then on a new one.
        notify(&writers, &key, &[ShardKey::local(ScopeId(1), 2)]);
        let heard = tokio::time::timeout(Duration::from_secs(10), other.recv())
            .await
            .expect("announced again on a new connection")
            .expect("a notification");
        assert!(heard.payload().ends_with("\n1:2:"));
        drop(held);
    }

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
