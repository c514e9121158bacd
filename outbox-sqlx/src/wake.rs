//! Wake-ups that cost the writers' commits nothing.
//!
//! When an [`OutboxTransaction`](crate::OutboxTransaction) commits, the shards it wrote are
//! announced, after the commit and outside it:
//!
//! - to the relays **in this process** on the same database, directly (no round trip): the
//!   announcement is an entry in a process-wide table of [`SqlxWakeups`] inboxes, keyed by
//!   backend and database ([`Dialect::database_key`]);
//! - to the relays **in other processes**, by the backend's
//!   [`Dialect::announce_elsewhere`] (PostgreSQL: one `NOTIFY` sent on a connection of its own,
//!   coalesced with every other announcement this process makes while it is in flight).
//!
//! Nothing is announced from inside the transaction, so no writer's commit waits for another's
//! (PostgreSQL serialises the commits of every transaction that queued a `NOTIFY`). A message
//! written some other way (with a plain transaction and [`write`](crate::write()), or by
//! another program) is found by the relay's polling: within its poll interval at worst, and
//! sooner while messages keep arriving.

use std::any::TypeId;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use outbox_core::store::{Wakeup, WakeupStream};
use outbox_core::{Error, ShardKey};
use sqlx::Pool;

use crate::dialect::Dialect;

/// More shards than this waiting in one [`Announced`] become [`Wakeup::Any`]: the relay sweeps.
const MOST_SHARDS: usize = 1_000;

/// Every live inbox of this process.
static INBOXES: LazyLock<Mutex<Vec<Weak<Inbox>>>> = LazyLock::new(Mutex::default);

/// A number drawn once per process, that tells this process's announcements to other
/// processes from its own when they come back (PostgreSQL's `NOTIFY` reaches the sender too).
pub fn process_nonce() -> u64 {
    static NONCE: LazyLock<u64> = LazyLock::new(|| RandomState::new().hash_one(std::process::id()));
    *NONCE
}

/// Where a relay's wake-ups in this process arrive.
#[derive(Debug)]
struct Inbox {
    backend: TypeId,
    database: String,
    pending: Mutex<Announced>,
    arrived: tokio::sync::Notify,
}

/// Announcements of commits, merged until they are taken: what a relay's inbox holds, and
/// what a backend's [`Dialect::announce_elsewhere`] keeps for its next message.
#[derive(Debug, Default)]
pub struct Announced {
    shards: BTreeSet<ShardKey>,
    any: bool,
}

impl Announced {
    /// Adds `shards`; none means "some, anywhere" ([`Wakeup::Any`]), as do too many.
    pub fn add<'a>(&mut self, shards: impl IntoIterator<Item = &'a ShardKey>) {
        let mut added = false;
        if !self.any {
            for shard in shards {
                self.shards.insert(shard.clone());
                added = true;
            }
        }
        if !added || self.shards.len() > MOST_SHARDS {
            self.any = true;
            self.shards.clear();
        }
    }

    /// Takes what was announced since the last take, if anything.
    pub fn take(&mut self) -> Option<Wakeup> {
        if std::mem::take(&mut self.any) {
            Some(Wakeup::Any)
        } else if self.shards.is_empty() {
            None
        } else {
            Some(Wakeup::Shards(
                std::mem::take(&mut self.shards).into_iter().collect(),
            ))
        }
    }
}

/// Announces to the relays in this process on `database` (on every database of backend `D`
/// when `None`: a transaction that does not know its pool) that `shards` were committed; no
/// shards means "some, anywhere".
pub(crate) fn announce_here<D: Dialect>(database: Option<&str>, shards: &[ShardKey]) {
    let backend = TypeId::of::<D>();
    let mut inboxes = INBOXES.lock().unwrap_or_else(PoisonError::into_inner);
    inboxes.retain(|inbox| {
        let Some(inbox) = inbox.upgrade() else {
            return false;
        };
        if inbox.backend == backend && database.is_none_or(|database| database == inbox.database) {
            inbox
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .add(shards);
            inbox.arrived.notify_one();
        }
        true
    });
}

/// Announces what a commit on `pool` (if the transaction knows it) wrote: to the relays of
/// this process, then to those of others.
pub(crate) fn committed<D: Dialect>(pool: Option<&Pool<D::Database>>, shards: &[ShardKey]) {
    match pool {
        Some(pool) => {
            let database = D::database_key(pool);
            announce_here::<D>(Some(&database), shards);
            D::announce_elsewhere(pool, &database, shards);
        }
        None => announce_here::<D>(None, shards),
    }
}

/// A relay's wake-ups on a `sqlx` backend: the announcements of this process's commits
/// (see the [module](self)), and the backend's own stream from other processes
/// ([`Dialect::wakeups`]: PostgreSQL's `LISTEN`), whichever comes first.
#[derive(Debug)]
pub struct SqlxWakeups<D: Dialect> {
    inbox: Arc<Inbox>,
    elsewhere: Option<D::Wakeups>,
}

impl<D: Dialect> SqlxWakeups<D> {
    /// Subscribes to the announcements of commits on `pool`'s database in this process, and
    /// if `other_processes`, opens the backend's stream of those in other processes.
    pub(crate) async fn open(
        pool: &Pool<D::Database>,
        other_processes: bool,
    ) -> Result<Self, Error> {
        let elsewhere = if other_processes {
            D::wakeups(pool).await?
        } else {
            None
        };
        let inbox = Arc::new(Inbox {
            backend: TypeId::of::<D>(),
            database: D::database_key(pool),
            pending: Mutex::default(),
            arrived: tokio::sync::Notify::new(),
        });
        INBOXES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&inbox));
        Ok(Self { inbox, elsewhere })
    }
}

impl Inbox {
    /// The next announcement. Cancel-safe: what arrives waits in `pending` until taken.
    async fn next(&self) -> Wakeup {
        loop {
            let taken = self
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(wakeup) = taken {
                return wakeup;
            }
            self.arrived.notified().await;
        }
    }
}

impl<D: Dialect> WakeupStream for SqlxWakeups<D> {
    async fn next(&mut self) -> Result<Wakeup, Error> {
        match &mut self.elsewhere {
            Some(elsewhere) => tokio::select! {
                wakeup = self.inbox.next() => Ok(wakeup),
                wakeup = elsewhere.next() => wakeup,
            },
            None => Ok(self.inbox.next().await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ScopeId;

    #[test]
    fn pending_announcements_merge_and_overflow_to_any() {
        let shard = |n| ShardKey::local(ScopeId(1), n);
        let mut pending = Announced::default();
        assert_eq!(pending.take(), None);
        pending.add(&[shard(2), shard(1)]);
        pending.add(&[shard(2)]);
        assert_eq!(
            pending.take(),
            Some(Wakeup::Shards(vec![shard(1), shard(2)]))
        );
        assert_eq!(pending.take(), None);
        pending.add(&[]);
        pending.add(&[shard(3)]);
        assert_eq!(
            pending.take(),
            Some(Wakeup::Any),
            "an empty announcement is 'any'"
        );
        let many: Vec<ShardKey> = (0..=MOST_SHARDS as i64).map(shard).collect();
        pending.add(&many);
        assert_eq!(pending.take(), Some(Wakeup::Any));
        assert_eq!(pending.take(), None);
    }
}
