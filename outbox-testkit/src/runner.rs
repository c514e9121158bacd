//! [`outbox_runner`]: run the code under test, then deliver what it wrote, repeating while the
//! handlers write more (the seeds' `outbox_runner()`).

use std::fmt;
use std::future::Future;

use outbox_core::Relay;
use outbox_core::admin::Admin;
use outbox_core::relay::FlushError;
use outbox_core::store::PendingMessage;
use outbox_core::store::Store;

/// How many rounds of delivery [`outbox_runner`] makes before it decides that the handlers'
/// cascade does not end.
pub const MAX_ROUNDS: usize = 10;

/// Why [`outbox_runner`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunnerError<E> {
    /// The code under test failed: nothing was delivered.
    Code(E),
    /// A handler failed (or the database did) while delivering: the error carries the
    /// failed message's category and id, and the handler's error as its source.
    Flush(FlushError),
    /// Every one of [`MAX_ROUNDS`] rounds delivered something: the handlers keep writing new
    /// outboxes.
    RecursionLimit {
        /// The rounds made.
        rounds: usize,
        /// What was still pending after the last round (the oldest 20).
        pending: Vec<PendingMessage>,
    },
}

impl<E: fmt::Display> fmt::Display for RunnerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(error) => write!(f, "the code under test failed: {error}"),
            Self::Flush(_) => f.write_str("delivering the outboxes the code wrote failed"),
            Self::RecursionLimit { rounds, pending } => {
                write!(
                    f,
                    "the handlers were still writing outboxes after {rounds} rounds of \
                     delivery (a cascade that never ends?); pending:"
                )?;
                for row in pending {
                    write!(
                        f,
                        " [message {} category {} object {} in {}]",
                        row.id, row.category, row.object_identifier, row.shard
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for RunnerError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Flush(error) => Some(error),
            Self::Code(_) | Self::RecursionLimit { .. } => None,
        }
    }
}

/// Runs `code`, then, if it succeeded, delivers every outbox that is due, round after round
/// while the handlers write new ones (a round delivers what existed when it began), and
/// returns what `code` returned.
///
/// - `code` failing: nothing is delivered, [`RunnerError::Code`].
/// - a handler failing: [`RunnerError::Flush`], whose source chain ends in the handler's error;
///   its rows stay pending and its shard is not backed off.
/// - the handlers still writing after [`MAX_ROUNDS`] rounds: [`RunnerError::RecursionLimit`].
/// - shards in backoff (scheduled for later) are left alone.
///
/// ```
/// use outbox_core::{Category, CategoryId, Delivery, Message, Registry, Relay, Scope, ScopeId};
/// use outbox_testkit::runner::outbox_runner;
/// # struct Org;
/// # impl Scope for Org { const ID: ScopeId = ScopeId(1); const NAME: &'static str = "org"; }
/// # struct Renamed;
/// # impl Category for Renamed {
/// #     type Scope = Org; type Payload = String;
/// #     const ID: CategoryId = CategoryId(1); const NAME: &'static str = "renamed";
/// # }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let database = outbox_testkit::sqlite::SqliteTestDatabase::create().await;
/// let pool = database.pool();
/// outbox_sqlite::migrate(pool).await?;
/// let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
/// let registry = Registry::builder()
///     .handle::<Renamed>({
///         let seen = seen.clone();
///         move |delivery: Delivery<Renamed>| {
///             seen.lock().unwrap().push(delivery.payload);
///             async { Ok::<_, std::io::Error>(()) }
///         }
///     })
///     .build()?;
/// let relay = Relay::new(outbox_sqlite::SqliteStore::new(pool.clone()), registry);
///
/// outbox_runner(&relay, async {
///     let message = Message::new::<Renamed>(1, 1, &"Acme".to_owned())?;
///     outbox_sqlite::write(pool, &message).await
/// })
/// .await?;
/// assert_eq!(*seen.lock().unwrap(), ["Acme"]);
/// # Ok(())
/// # }
/// ```
pub async fn outbox_runner<S, T, E>(
    relay: &Relay<S>,
    code: impl Future<Output = Result<T, E>>,
) -> Result<T, RunnerError<E>>
where
    S: Store + Admin,
{
    let value = code.await.map_err(RunnerError::Code)?;
    for _ in 0..MAX_ROUNDS {
        let report = relay.flush_due().await.map_err(RunnerError::Flush)?;
        if report.deliveries == 0 && report.rows_acknowledged == 0 {
            return Ok(value);
        }
    }
    let pending = relay
        .store()
        .pending_messages(20)
        .await
        .map_err(|error| RunnerError::Flush(FlushError::Store(error)))?;
    Err(RunnerError::RecursionLimit {
        rounds: MAX_ROUNDS,
        pending,
    })
}
