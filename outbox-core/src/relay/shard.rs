//! Draining one claimed shard.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::config::RelayConfig;
use super::plan::{Group, Plan};
use crate::error::{DeliveryError, Error, error_chain};
use crate::handler::{HandlerContext, RawDelivery};
use crate::model::{MessageId, ShardKey};
use crate::registry::Registry;
use crate::store::{Failure, HandlerMode, Lease, Outcome, ShardSession, Store};

/// A delivery failure that backed a shard off.
#[derive(Debug)]
#[non_exhaustive]
pub struct ShardFailure {
    /// The shard.
    pub shard: ShardKey,
    /// What failed.
    pub error: DeliveryError,
    /// The shard's consecutive failed attempts, counting this one.
    pub attempts: u32,
    /// How long until the shard is retried (sooner if a new message arrives).
    pub retry_in: Duration,
}

/// What one claim of one shard did.
#[derive(Debug, Default)]
pub(crate) struct ShardRun {
    pub(crate) claimed: bool,
    pub(crate) deliveries: u64,
    pub(crate) rows_acknowledged: u64,
    pub(crate) failure: Option<ShardFailure>,
    pub(crate) lease_lost: Option<ShardKey>,
    /// The shard, if its budget ran out with rows left (released, still due).
    pub(crate) yielded: Option<ShardKey>,
}

/// How a claimed shard is drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainMode {
    /// Deliver only rows up to this id: those present when a flush began.
    pub(crate) up_to: Option<MessageId>,
    /// Whether a failure backs the shard off (the relay), or leaves its schedule as it was
    /// (a flush after commit: the caller hears of the failure, the relay retries).
    pub(crate) back_off: bool,
    /// Whether the shard yields when its row or time budget is spent (the relay, so that one
    /// hot shard cannot starve the others), or drains to its bound (a flush after commit,
    /// whose caller waits for exactly these rows: S2).
    pub(crate) budgeted: bool,
}

impl DrainMode {
    /// The relay's: everything, failures back off, budgets apply.
    pub(crate) const RELAY: Self = Self {
        up_to: None,
        back_off: true,
        budgeted: true,
    };

    /// A flush after commit: rows up to `up_to`, all of them, failures reported without
    /// backing off.
    pub(crate) fn flush(up_to: MessageId) -> Self {
        Self {
            up_to: Some(up_to),
            back_off: false,
            budgeted: false,
        }
    }
}

/// Delivers a claimed shard's groups in order until it is empty (up to the mode's bound), a
/// delivery fails, the budget is spent, or shutdown is requested; then records the outcome and
/// releases the shard.
pub(crate) async fn drain<St: Store>(
    mut session: St::Session,
    store: &St,
    registry: &Registry,
    config: &RelayConfig,
    shutdown: &watch::Receiver<bool>,
    mode: DrainMode,
) -> Result<ShardRun, Error> {
    let lease = session.lease().clone();
    match &lease.previous_owner {
        // This relay's own drain, interrupted by the database: the outage was logged once.
        Some(previous) if *previous == config.worker_id => {
            debug!(shard = %lease.shard, attempts = lease.attempts, "resuming a shard whose drain the database interrupted");
        }
        Some(previous) => {
            info!(shard = %lease.shard, previous_owner = %previous, attempts = lease.attempts, "took over a shard whose lease lapsed; its head is redelivered");
        }
        None => {}
    }
    let started = Instant::now();
    let mut run = ShardRun {
        claimed: true,
        ..ShardRun::default()
    };
    let mut progressed = false;
    let mut rows_delivered = 0u64;
    let mut watermark = MessageId(0);
    let budget_spent = |rows_delivered: u64| {
        *shutdown.borrow()
            || (mode.budgeted
                && (rows_delivered >= config.shard_row_budget as u64
                    || started.elapsed() >= config.shard_time_budget))
    };
    let up_to = mode.up_to.unwrap_or(MessageId(i64::MAX));
    let within_bound = |id: MessageId| id <= up_to;
    loop {
        let mut head = match session.fetch(config.batch_size).await {
            Ok(head) => head,
            Err(error @ Error::Undecodable { .. }) => {
                // A row written around the schema's checks: the shard waits on it, backing
                // off, and nothing is deleted. Only a message written after this moment
                // makes it due before its backoff ends.
                let watermark = store.newest_message_id().await?.unwrap_or(watermark);
                let error = DeliveryError::Undecodable {
                    source: Box::new(error),
                };
                return fail(
                    session, &lease, error, watermark, progressed, mode, config, run,
                )
                .await;
            }
            Err(error) => return Err(error),
        };
        let full = head.len() >= config.batch_size;
        head.retain(|row| within_bound(row.id));
        let Some(last) = head.last() else {
            // Nothing (left) to deliver. A bounded flush that delivered nothing leaves the
            // shard's state as it found it.
            let outcome = if progressed || mode.up_to.is_none() {
                Outcome::Drained
            } else {
                Outcome::Released
            };
            finish(session, outcome, &mut run).await?;
            return Ok(run);
        };
        watermark = watermark.max(last.id);
        let mut plan = Plan::new(&head, &lease.shard, registry);
        // A full read may not hold a group's newest row; a read the bound cut holds them all.
        if full && head.len() >= config.batch_size {
            let keys = plan.coalescing_keys();
            if !keys.is_empty() {
                for tail in session.fetch_newest(&keys, last.id, up_to).await? {
                    watermark = watermark.max(tail.newest.id);
                    plan.extend(&tail);
                }
            }
        }

        // The attempt at the shard's head: once a group gets through, the next is on its first;
        // but after a takeover, every group of the first read may have been delivered by the
        // worker whose lease lapsed, and is a retry.
        let retrying = !progressed && lease.previous_owner.is_some();
        let mut attempt = if progressed { 1 } else { lease.attempts + 1 };
        let mut acks = Vec::with_capacity(plan.groups.len());
        let mut failure = None;
        let mut out_of_budget = false;
        for group in &plan.groups {
            // After a takeover the whole first read is delivered before the shard yields: the
            // worker whose lease lapsed may have delivered any of it, and only this drain
            // knows to call its deliveries retries.
            if budget_spent(rows_delivered)
                && (progressed || !acks.is_empty())
                && (!retrying || *shutdown.borrow())
            {
                out_of_budget = true;
                break;
            }
            session.before_handler().await?;
            let result = deliver(
                &mut session,
                store,
                &lease,
                group,
                attempt,
                config,
                registry,
            )
            .await;
            session.after_handler(result.is_ok()).await?;
            match result {
                Ok(()) => {
                    if !retrying {
                        attempt = 1;
                    }
                    acks.push(group.acknowledgement());
                    rows_delivered += group.rows();
                    run.deliveries += 1;
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }

        // The read held every row the shard had and all are delivered: acknowledge and
        // release at once (no need to read again to learn that it is empty; a row written
        // since is not lost: releasing a shard that still has rows leaves it due).
        let drained = failure.is_none()
            && !out_of_budget
            && plan.blocked.is_none()
            && !full
            && !budget_spent(rows_delivered);
        if drained && !acks.is_empty() {
            match session.ack_and_finish(&acks, Outcome::Drained).await {
                Ok((rows, released)) => {
                    run.rows_acknowledged += rows;
                    if !released {
                        warn!(shard = %lease.shard, "lease lost before releasing; another worker owns the shard");
                        run.lease_lost = Some(lease.shard);
                    }
                    return Ok(run);
                }
                Err(Error::LeaseLost { shard, token }) => {
                    warn!(%shard, token, "lease lost before acknowledging; another worker owns the shard");
                    run.lease_lost = Some(shard);
                    return Ok(run);
                }
                Err(error) => return Err(error),
            }
        }
        if !acks.is_empty() {
            match session.ack(&acks).await {
                Ok(rows) => {
                    run.rows_acknowledged += rows;
                    progressed = true;
                }
                Err(Error::LeaseLost { shard, token }) => {
                    warn!(%shard, token, "lease lost before acknowledging; another worker owns the shard");
                    run.lease_lost = Some(shard);
                    return Ok(run);
                }
                Err(error) => return Err(error),
            }
        }

        let all_delivered = failure.is_none() && !out_of_budget;
        let failure = failure.or(if all_delivered { plan.blocked } else { None });
        if let Some(error) = failure {
            return fail(
                session, &lease, error, watermark, progressed, mode, config, run,
            )
            .await;
        }
        if out_of_budget || budget_spent(rows_delivered) {
            debug!(shard = %lease.shard, rows_delivered, "budget spent; shard yields");
            finish(session, Outcome::Yielded, &mut run).await?;
            run.yielded = Some(lease.shard);
            return Ok(run);
        }
    }
}

/// Ends the drain on a failed delivery: the relay backs the shard off; a flush releases it as
/// it was and reports the failure (S2).
#[allow(clippy::too_many_arguments)]
async fn fail<S: ShardSession>(
    session: S,
    lease: &Lease,
    error: DeliveryError,
    watermark: MessageId,
    progressed: bool,
    mode: DrainMode,
    config: &RelayConfig,
    mut run: ShardRun,
) -> Result<ShardRun, Error> {
    if !mode.back_off {
        debug!(shard = %lease.shard, error = %error_chain(&error), "delivery failed during a flush; the relay will retry");
        finish(session, Outcome::Released, &mut run).await?;
        run.failure = Some(ShardFailure {
            shard: lease.shard.clone(),
            error,
            attempts: lease.attempts,
            retry_in: Duration::ZERO,
        });
        return Ok(run);
    }
    let attempts = if progressed { 1 } else { lease.attempts + 1 };
    let retry_in = config.backoff.delay(attempts);
    warn!(shard = %lease.shard, attempts, ?retry_in, error = %error_chain(&error), "delivery failed; shard backs off");
    let failure = Failure {
        error: error_chain(&error),
        attempts,
        retry_in,
        watermark,
        parked_category: error.parked_category(),
    };
    finish(session, Outcome::Failed(failure), &mut run).await?;
    run.failure = Some(ShardFailure {
        shard: lease.shard.clone(),
        error,
        attempts,
        retry_in,
    });
    Ok(run)
}

/// Records the outcome; a lease lost meanwhile is reported, not an error: the new owner
/// carries on.
async fn finish<S: ShardSession>(
    session: S,
    outcome: Outcome,
    run: &mut ShardRun,
) -> Result<(), Error> {
    match session.finish(outcome).await {
        Err(Error::LeaseLost { shard, token }) => {
            warn!(%shard, token, "lease lost before releasing; another worker owns the shard");
            run.lease_lost = Some(shard);
            Ok(())
        }
        result => result,
    }
}

async fn deliver<S: ShardSession, St: Store>(
    session: &mut S,
    store: &St,
    lease: &Lease,
    group: &Group,
    attempt: u32,
    config: &RelayConfig,
    registry: &Registry,
) -> Result<(), DeliveryError> {
    let row = match &group.info.model {
        Some(table) => session
            .load_model(table, group.newest.object_identifier)
            .await
            .map_err(|source| DeliveryError::Lookup {
                model: group.info.name,
                table: table.table,
                object_identifier: group.newest.object_identifier,
                source: Box::new(source),
            })?,
        None => None,
    };
    let mut cx = HandlerContext::new(session.handler_connection()).with_state(registry.state());
    let call = group.info.handler.call(
        RawDelivery {
            shard: &lease.shard,
            message: &group.newest,
            attempt,
            fencing_token: lease.token,
            row: row.as_deref(),
        },
        &mut cx,
    );
    let call = keeping_the_lease(AssertUnwindSafe(call).catch_unwind(), store, lease, config);
    let outcome = match config.handler_timeout {
        Some(timeout) => match tokio::time::timeout(timeout, call).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Err(DeliveryError::TimedOut {
                    category: group.info.name,
                    message_id: group.newest.id,
                    timeout,
                });
            }
        },
        None => call.await,
    };
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(DeliveryError::Panicked {
            category: group.info.name,
            message_id: group.newest.id,
            panic: panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned()),
        }),
    }
}

/// Runs `call` (a handler) while extending the lease beside it, every third of the lease: a
/// live relay keeps its shard however long its handler takes, and only a dead one loses it
/// (S16, S17). In transaction mode the claiming transaction holds the shard, and there is
/// nothing to extend.
async fn keeping_the_lease<F: Future, St: Store>(
    call: F,
    store: &St,
    lease: &Lease,
    config: &RelayConfig,
) -> F::Output {
    if config.handler_mode == HandlerMode::InTransaction {
        return call.await;
    }
    tokio::pin!(call);
    // A handler that finishes at its first poll needs no heartbeat: no timer for it.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(output) = first {
        return output;
    }
    let every = (config.lease / 3).max(Duration::from_millis(10));
    let heartbeat = async {
        let mut beats = tokio::time::interval_at(Instant::now() + every, every);
        loop {
            beats.tick().await;
            match store.extend_lease(lease, config.lease).await {
                Ok(true) => debug!(shard = %lease.shard, "lease extended while a handler runs"),
                Ok(false) => {
                    warn!(shard = %lease.shard, token = lease.token, "lease lost while a handler runs; another worker owns the shard");
                    return std::future::pending::<()>().await;
                }
                Err(error) => {
                    debug!(shard = %lease.shard, error = %error_chain(&error), "cannot extend the lease; trying again");
                }
            }
        }
    };
    tokio::select! {
        output = &mut call => output,
        () = heartbeat => unreachable!("the heartbeat never ends"),
    }
}
