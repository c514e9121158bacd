//! Errors of the outbox: one enum for operations, read by services; what a registry refuses
//! to build ([`RegistryProblem`]), read by whoever declares; how a model and its table differ
//! ([`ColumnMismatch`]), read by whoever declares the model.

use std::fmt;

mod columns;
mod registry;

pub use self::columns::ColumnMismatch;
use self::registry::DisplayList;
pub use self::registry::{RegistryProblem, Site, SourceLocation};
pub use crate::id::{IdOutOfRange, ParseIdError};
use crate::key::{CategoryId, MessageId, ScopeId, ShardKey};
use crate::secret::redact_url;

/// A boxed error from user code or a foreign library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors returned by the outbox: by the write path, the registry, the stores and the relay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database could not be reached, or the connection was lost. Retrying may succeed.
    #[error("database unavailable")]
    Unavailable {
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// A statement failed for a reason other than connectivity.
    #[error("database error while {operation}")]
    Database {
        /// What the outbox was doing.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// The database URL could not be used. Build it with [`Error::invalid_database_url`],
    /// which removes the URL's secrets.
    #[error("invalid database url `{url}`: {reason}")]
    InvalidDatabaseUrl {
        /// The URL, with its password and secret parameters replaced ([`redact_url`]).
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The outbox tables are missing or older than this binary expects. (A schema newer than
    /// the binary is fine: outbox migrations are additive.)
    #[error(
        "the outbox schema is not migrated: {detail}; apply this binary's outbox migrations \
         before the relay starts: call the backend's `migrate(&pool)` at start-up \
         (`outbox::postgres::migrate`, `outbox::mysql::migrate` or `outbox::sqlite::migrate`), \
         run `outbox migrate`, or, if a migration tool of your own runs them, give it the \
         backend's `migrator()` (or the SQL files of the backend crate's `migrations/` \
         directory, recorded in `_outbox_migrations`)"
    )]
    MigrationMissing {
        /// What is missing.
        detail: String,
    },

    /// Applying the migrations failed.
    #[error("applying the outbox migrations failed: {detail}")]
    Migrate {
        /// Which migration failed, why, and what to do.
        detail: String,
        /// The migrator's error.
        #[source]
        source: BoxError,
    },

    /// The worker's lease on a shard expired and another worker claimed it: the stale worker
    /// may not acknowledge (delete) rows that the new owner is responsible for.
    #[error("lease on {shard} was lost (fencing token {token} is no longer current)")]
    LeaseLost {
        /// The shard.
        shard: ShardKey,
        /// The stale fencing token.
        token: i64,
    },

    /// A dead letter to replay or purge does not exist: it was replayed or purged already,
    /// or never was one. Nothing was changed.
    #[error(
        "no dead letter with message id {}: replayed or purged already? (list them with \
         `outbox dead-letters list`); nothing was changed",
        .ids.iter().map(|id| id.0.to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoSuchDeadLetter {
        /// The ids that are not dead letters.
        ids: Vec<MessageId>,
    },

    /// A message to set aside is not pending: delivered, set aside already, or never written.
    /// Nothing was changed.
    #[error(
        "no pending message with id {id}: delivered or set aside already? (a shard's messages: \
         `outbox messages SHARD`); nothing was changed"
    )]
    NoSuchMessage {
        /// The id.
        id: MessageId,
    },

    /// A relay holds the shard of a message to set aside: its drain may be delivering
    /// the message, so it is not taken from under it. Nothing was changed.
    #[error(
        "{shard} is held by {}: its drain may be delivering the message; try again once it \
         lets go, or pause the shard first; nothing was changed",
        .owner.as_deref().unwrap_or("a relay")
    )]
    ShardHeld {
        /// The shard.
        shard: ShardKey,
        /// The relay holding it, where known.
        owner: Option<String>,
    },

    /// A message names a category the registry does not know.
    #[error("unknown category {category}: it is not in this binary's registry")]
    UnknownCategory {
        /// The unknown category.
        category: CategoryId,
    },

    /// A message's scope is not the scope of its category.
    #[error(
        "category `{category}` belongs to scope {expected} (`{expected_name}`), \
         not to scope {found}"
    )]
    ScopeMismatch {
        /// The category's name.
        category: &'static str,
        /// The category's own scope.
        expected: ScopeId,
        /// The name of the category's own scope.
        expected_name: &'static str,
        /// The scope the message was given.
        found: ScopeId,
    },

    /// A payload could not be serialized to JSON.
    #[error("the payload of category `{category}` cannot be serialized to JSON")]
    Serialize {
        /// The category's name.
        category: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },

    /// A replicated model does not serialize to the columns of its table.
    #[error("replicated model `{model}` cannot be written: {detail}")]
    ModelShape {
        /// The model's category name.
        model: &'static str,
        /// What does not match.
        detail: String,
    },

    /// A replicated model does not match its table: found before the model's first write
    /// (and by the backends' `check_model`), so that no row is written that would not read
    /// back.
    #[error("replicated model `{model}` does not match its table `{table}`: {mismatch}")]
    ModelMismatch {
        /// The model's category name.
        model: &'static str,
        /// The model's table.
        table: &'static str,
        /// What does not match.
        mismatch: ColumnMismatch,
    },

    /// A model write names one key more than once. Nothing is written: which of the models
    /// should the row hold, and which outbox announce it? Write them in separate calls, in
    /// the order they should apply.
    #[error(
        "replicated model `{model}` cannot be written: key {key} appears more than once in one call"
    )]
    DuplicateKey {
        /// The model's category name.
        model: &'static str,
        /// The key.
        key: crate::id::Id,
    },

    /// A destination name is not acceptable.
    #[error("invalid destination name {name:?}: {reason}")]
    InvalidDestination {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A stored outbox row does not have the form the outbox schema gives it (it was written
    /// by hand, around the schema's checks). It is never deleted: its shard waits, with this
    /// error, until the row is repaired or removed.
    #[error("outbox row {} cannot be read while {operation}: {detail}",
        message_id.map_or_else(|| "?".to_owned(), |id| id.to_string()))]
    Undecodable {
        /// What the outbox was doing.
        operation: &'static str,
        /// The row's id, if it could be read.
        message_id: Option<MessageId>,
        /// What is wrong with it.
        detail: String,
    },

    /// A setting cannot work, and retrying will not change that: a relay setting (see
    /// [`RelayConfig`](crate::RelayConfig)), refused when the configuration is built, or the
    /// database connection's (TLS asked for on a build without TLS, a certificate that does
    /// not verify, options the driver refuses), refused when connecting. A relay meeting it
    /// at start-up stops with it instead of retrying.
    #[error("invalid configuration: `{setting}` {problem}")]
    InvalidConfig {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        problem: String,
    },

    /// The store cannot do what it was asked to (the in-memory store cannot run handlers in
    /// a transaction: it has none to lend them).
    #[error("{store} does not support {feature}")]
    Unsupported {
        /// Which store.
        store: &'static str,
        /// What it does not support.
        feature: &'static str,
    },

    /// A backfill cannot walk a row of its model: the row does not read back as the model,
    /// or its outboxes cannot be made (a fan-out model that names no destinations, a local
    /// model's backfill started with destinations). The batch writes nothing and the
    /// watermark stays where it was; the model's backfill records the error.
    #[error("the backfill of `{model}` cannot walk row {}: {detail}",
        key.map_or_else(|| "?".to_owned(), |key| key.to_string()))]
    BackfillRow {
        /// The model's name.
        model: &'static str,
        /// The row's key, if it could be read.
        key: Option<crate::id::Id>,
        /// What is wrong.
        detail: String,
    },

    /// A backfill batch could not record its progress on the model's watermark: the batch
    /// failed and its outboxes were rolled back with it (written in the same transaction), so
    /// the next tick walks the same rows again. The source says why.
    #[error(
        "the backfill of `{model}` could not record its progress; the batch is rolled back and walked again"
    )]
    BackfillWatermark {
        /// The model's name.
        model: &'static str,
        /// Why the watermark was not written.
        #[source]
        source: Box<Error>,
    },

    /// The registry has conflicting declarations.
    #[error("invalid outbox registry: {}", DisplayList(problems))]
    Registry {
        /// Every problem found, not just the first.
        problems: Vec<RegistryProblem>,
    },
}

impl Error {
    /// An [`Error::InvalidDatabaseUrl`] for `url`, shown without its secrets ([`redact_url`]);
    /// the `reason` (often a driver's, quoting the value it could not read) without them
    /// either.
    pub fn invalid_database_url(url: &str, reason: impl Into<String>) -> Self {
        Self::InvalidDatabaseUrl {
            url: redact_url(url),
            reason: crate::secret::redact_url_in(&reason.into(), url),
        }
    }

    /// Whether the error means the database is (perhaps temporarily) out of reach.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::BackfillWatermark { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }

    /// The error of one statement or transaction done for `count` parties (a batch of
    /// shards finished together), as one error each: each reads as this one and is an outage
    /// if it is ([`Error::is_unavailable`]); any other is a database error while `operation`.
    pub fn shared_by(self, count: usize, operation: &'static str) -> Vec<Error> {
        let unavailable = self.is_unavailable();
        let shared = std::sync::Arc::new(self);
        (0..count)
            .map(|_| {
                let source: BoxError = Box::new(Shared(std::sync::Arc::clone(&shared)));
                if unavailable {
                    Self::Unavailable { source }
                } else {
                    Self::Database { operation, source }
                }
            })
            .collect()
    }
}

/// An error several parties share ([`Error::shared_by`]): reads as the error it holds.
#[derive(Debug)]
struct Shared(std::sync::Arc<Error>);

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Renders an error with all of its causes: `outer: inner: innermost`, each cause once.
///
/// Many errors (`sqlx`'s among them) print their cause in their own message and return it
/// from [`source`](std::error::Error::source) as well; a cause whose text the message printed
/// last holds already is not printed again.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !cause_text.is_empty() && !last.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
            last = cause_text;
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::{Error, error_chain};

    /// An error with a cause, which its message prints (as `sqlx`'s errors do) or not.
    #[derive(Debug)]
    struct Cause {
        text: &'static str,
        prints_cause: bool,
        cause: Option<Box<Cause>>,
    }

    impl Cause {
        fn new(text: &'static str, prints_cause: bool, cause: Option<Cause>) -> Self {
            Self {
                text,
                prints_cause,
                cause: cause.map(Box::new),
            }
        }
    }

    impl fmt::Display for Cause {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.text)?;
            match &self.cause {
                Some(cause) if self.prints_cause => write!(f, ": {cause}"),
                _ => Ok(()),
            }
        }
    }

    impl std::error::Error for Cause {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.cause.as_deref().map(|cause| cause as _)
        }
    }

    #[test]
    fn error_chains_print_each_cause_once() {
        let innermost = Cause::new("expected `,` at line 1 column 768", false, None);
        let middle = Cause::new("error decoding column 0", true, Some(innermost));
        let error = Error::Database {
            operation: "reading a model",
            source: Box::new(middle),
        };
        assert_eq!(
            error_chain(&error),
            "database error while reading a model: error decoding column 0: expected `,` at \
             line 1 column 768"
        );
    }

    #[test]
    fn error_chains_print_causes_their_errors_do_not() {
        let inner = Cause::new("connection refused", false, None);
        let error = Error::Unavailable {
            source: Box::new(Cause::new("cannot connect", false, Some(inner))),
        };
        assert_eq!(
            error_chain(&error),
            "database unavailable: cannot connect: connection refused"
        );
    }

    /// A missing migration names what applies it on every backend, and the command.
    #[test]
    fn a_missing_migration_says_how_to_apply_it_on_each_backend() {
        let shown = Error::MigrationMissing {
            detail: "no outbox_messages table".to_owned(),
        }
        .to_string();
        for advice in [
            "outbox::postgres::migrate",
            "outbox::mysql::migrate",
            "outbox::sqlite::migrate",
            "outbox migrate",
            "migrator()",
        ] {
            assert!(shown.contains(advice), "{advice} not in: {shown}");
        }
    }
}
