//! The schedule of a store's passes that give back the space its tables keep after a held
//! cleanup horizon (PostgreSQL's rewrite, MariaDB's online rebuild): at most one pass every
//! [`EVERY`], one at a time, each in a task of its own; a table rewritten within
//! [`REWRITE_EVERY`] left alone; a failure other than a refused lock said once at `warn`.
//!
//! What a pass looks at and how it rewrites is the backend's; this is the part they share.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a store looks (at most).
pub const EVERY: Duration = Duration::from_secs(5);

/// How often a store rewrites one table (at most): a table that a high rate makes large in its
/// steady state is not rewritten again and again.
pub const REWRITE_EVERY: Duration = Duration::from_secs(300);

/// What one pass did with each table it found sparse.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rewrites {
    /// Rewritten.
    pub rewritten: Vec<String>,
    /// Refused for now (a reader's lock, a lock not granted in time): tried again at the next
    /// pass.
    pub refused: Vec<String>,
}

/// The passes of one store (its clones share it through an [`Arc`]).
#[derive(Debug, Default)]
pub struct Passes {
    last: Mutex<Option<Instant>>,
    /// The tables this store rewrote, and when.
    rewritten: Mutex<HashMap<String, Instant>>,
    running: AtomicBool,
    /// A pass failed for a reason other than a lock (a missing right): said once.
    warned: AtomicBool,
}

impl Passes {
    /// Starts `pass` in a task of its own, unless one started within [`EVERY`] or is
    /// running. `pass` is given the tables this store rewrote within [`REWRITE_EVERY`], to
    /// leave alone. A failure is said at `warn` once, with `missing` (what the relay's
    /// database user lacks when a pass fails that way), and at `debug` after.
    pub fn now_and_then<F, Fut>(self: &Arc<Self>, missing: &'static str, pass: F)
    where
        F: FnOnce(Vec<String>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Rewrites, sqlx::Error>> + Send + 'static,
    {
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if last.is_some_and(|at| now.duration_since(at) < EVERY) {
                return;
            }
            *last = Some(now);
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let recent = {
                let mut rewritten = this.rewritten();
                rewritten.retain(|_, at| at.elapsed() < REWRITE_EVERY);
                rewritten.keys().cloned().collect()
            };
            match pass(recent).await {
                Ok(rewrites) if !rewrites.rewritten.is_empty() => {
                    tracing::info!(
                        tables = ?rewrites.rewritten,
                        "outbox tables rewritten: the space a held cleanup horizon left is \
                         given back"
                    );
                    let mut rewritten = this.rewritten();
                    for table in rewrites.rewritten {
                        rewritten.insert(table, Instant::now());
                    }
                }
                Ok(_) => {}
                Err(error) if this.warned.swap(true, Ordering::AcqRel) => {
                    tracing::debug!(%error, "rewriting the outbox's sparse tables failed");
                }
                Err(error) => tracing::warn!(
                    %error,
                    "the outbox's tables cannot give back the space a held cleanup horizon \
                     leaves: it is only reused ({missing})"
                ),
            }
            this.running.store(false, Ordering::Release);
        });
    }

    fn rewritten(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.rewritten
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
