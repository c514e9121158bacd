//! How a console behaves, and what it works on.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::admin::{Catalog, Operations};

/// How a console behaves: read-only or with actions, the names it shows, how often it
/// samples and refreshes.
#[derive(Clone)]
pub struct ConsoleOptions {
    pub(crate) token: Option<Arc<str>>,
    pub(crate) catalog: Catalog,
    pub(crate) sample_every: Duration,
    pub(crate) refresh_every: Duration,
    pub(crate) secure_cookies: bool,
}

impl std::fmt::Debug for ConsoleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleOptions")
            .field("actions", &self.token.is_some())
            .field("sample_every", &self.sample_every)
            .field("refresh_every", &self.refresh_every)
            .finish_non_exhaustive()
    }
}

/// A token too short to guard actions ([`ConsoleOptions::with_actions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeakToken {
    /// The token's length, in characters.
    pub length: usize,
}

impl std::fmt::Display for WeakToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the console's action token has {} characters: it needs at least {}",
            self.length,
            ConsoleOptions::MIN_TOKEN
        )
    }
}

impl std::error::Error for WeakToken {}

impl ConsoleOptions {
    /// The shortest token [`ConsoleOptions::with_actions`] takes.
    pub const MIN_TOKEN: usize = 16;

    /// Pages only: every action is refused. Names from the declarations linked into this
    /// binary ([`Catalog::discovered`]).
    pub fn read_only() -> Self {
        Self {
            token: None,
            catalog: Catalog::discovered(),
            sample_every: Duration::from_secs(30),
            refresh_every: Duration::from_secs(5),
            secure_cookies: false,
        }
    }

    /// Pages and actions, each action allowed to whoever gives `token` (at least
    /// [`MIN_TOKEN`](Self::MIN_TOKEN) characters: a long random string).
    pub fn with_actions(token: impl Into<String>) -> Result<Self, WeakToken> {
        let token: String = token.into();
        let length = token.chars().count();
        if length < Self::MIN_TOKEN {
            return Err(WeakToken { length });
        }
        Ok(Self {
            token: Some(token.into()),
            ..Self::read_only()
        })
    }

    /// Shows scopes and categories by the names `catalog` knows (by default, those
    /// declared in this binary).
    pub fn catalog(mut self, catalog: Catalog) -> Self {
        self.catalog = catalog;
        self
    }

    /// Samples the pending messages and the oldest's age this often, for the overview's
    /// chart of the last hour (every 30 s by default).
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.sample_every = every.max(Duration::from_millis(10));
        self
    }

    /// Refreshes the live pages this often where JavaScript runs (every 5 s by default).
    pub fn refresh_every(mut self, every: Duration) -> Self {
        self.refresh_every = every.max(Duration::from_millis(500));
        self
    }

    /// Marks the session cookie `Secure`, so that browsers send it over HTTPS only: for a
    /// console served over TLS (directly or behind a proxy that terminates it), which it
    /// cannot tell by itself. Off by default, for a console on `http://localhost`.
    pub fn secure_cookies(mut self) -> Self {
        self.secure_cookies = true;
        self
    }

    /// Whether actions are enabled.
    pub fn actions_enabled(&self) -> bool {
        self.token.is_some()
    }
}

/// The operations a console reads and changes, shared: any store (`PgStore`, `SqliteStore`,
/// `MemoryStore`), or a database a tool opened by its URL
/// ([`Backend::connect`](outbox_core::admin::Backend::connect)).
pub type Outbox = Arc<dyn Operations>;
