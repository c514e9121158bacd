//! One delivery: a group's handler called under the shard's lease.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::{Instrument, Span, debug, info_span, warn};

use super::Inner;
use super::plan::Group;
use crate::error::error_chain;
use crate::handler::DeliveryError;
use crate::handler::{HandlerContext, Pipeline, Pipelined, RawDelivery};
use crate::store::{HandlerMode, Lease, ShardSession, Store};

/// Delivers `group` in a span of its own (`outbox.deliver`: category, message, object, shard,
/// attempt, fencing token; related to the producer's trace with the `opentelemetry` feature),
/// reporting its duration, lag and outcome as metrics and events: success at debug, failure at
/// warn with the error's chain.
///
/// `since` is when the lease was last set, by this relay's clock (before it asked): moved on
/// by each extension while the handler runs.
pub(super) async fn deliver<S: ShardSession, St: Store>(
    session: &mut S,
    inner: &Inner<St>,
    lease: &Lease,
    since: &mut Instant,
    group: &Group,
    attempt: u32,
) -> Result<(), DeliveryError> {
    let span = span_of(inner, lease, group, attempt);
    async {
        let started = Instant::now();
        let result = call_handler(session, inner, lease, since, group, attempt).await;
        reported(inner, group, started.elapsed(), result.as_ref().err());
        result
    }
    .instrument(crate::telemetry::recorded(span))
    .await
}

/// Delivers `groups`, consecutive groups of the shard whose handler takes them at once
/// (`pipeline`: a sink's publisher, which pipelines them), the first at attempt `attempts[0]`
/// and so on: under the lease and the handler timeout, each reported in a span of its own as
/// [`deliver`] reports it. How many, from the first, got through, the error of the first
/// that did not, and those after it that got through all the same.
pub(super) async fn deliver_all<St: Store>(
    pipeline: &dyn Pipeline,
    inner: &Inner<St>,
    lease: &Lease,
    since: &mut Instant,
    groups: &[Group],
    attempts: &[u32],
) -> Pipelined {
    let spans: Vec<Span> = groups
        .iter()
        .zip(attempts)
        .map(|(group, &attempt)| span_of(inner, lease, group, attempt))
        .collect();
    let raws: Vec<RawDelivery<'_>> = groups
        .iter()
        .zip(attempts)
        .map(|(group, &attempt)| raw_delivery(lease, group, attempt, None))
        .collect();
    let started = Instant::now();
    let pipelined = match guarded(pipeline.call_all(&raws), inner, lease, since, &groups[0]).await {
        Ok(pipelined) => pipelined,
        Err(error) => Pipelined::failed(0, error),
    };
    let took = started.elapsed();
    for (index, (group, span)) in groups.iter().zip(&spans).enumerate() {
        let error = if index < pipelined.confirmed || pipelined.confirmed_after.contains(&index) {
            None
        } else if index == pipelined.confirmed && pipelined.error.is_some() {
            pipelined.error.as_ref()
        } else {
            // Not reached, or not known to be stored: delivered again later.
            continue;
        };
        span.in_scope(|| reported(inner, group, took, error));
    }
    pipelined
}

/// The span of one delivery.
fn span_of<St: Store>(inner: &Inner<St>, lease: &Lease, group: &Group, attempt: u32) -> Span {
    let message = &group.newest;
    let span = info_span!(
        "outbox.deliver",
        category = group.info.identity.name,
        message_id = message.id.0,
        object = %message.object_identifier,
        shard = %lease.shard,
        attempt,
        fencing_token = lease.token,
        rows = group.rows(),
    );
    #[cfg(feature = "opentelemetry")]
    if let Some(metadata) = message
        .metadata
        .as_deref()
        .and_then(|json| crate::metadata::Metadata::from_json(json).ok())
    {
        crate::trace::relate(&span, &metadata, inner.config.trace_relation);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = inner;
    span
}

/// Reports a delivery that took `took` and ended with `error` (or got through): its metrics,
/// and an event in the current span.
fn reported<St: Store>(
    inner: &Inner<St>,
    group: &Group,
    took: Duration,
    error: Option<&DeliveryError>,
) {
    let metrics = inner.metrics().category(group.info.identity.id);
    let lag = SystemTime::now()
        .duration_since(group.newest.created_at)
        .unwrap_or_default();
    match error {
        None => {
            if let Some(metrics) = metrics {
                metrics.delivered(group.rows(), lag, took);
            }
            debug!(?took, "delivered");
        }
        Some(error) => {
            if let Some(metrics) = metrics {
                metrics.failed(error.kind(), lag, took);
            }
            if error.breaker().is_some() {
                // The breaker logged the outage once; each shard it parks is a detail.
                debug!(?took, kind = error.kind(), error = %error_chain(error), "delivery found its system unavailable");
            } else {
                warn!(?took, kind = error.kind(), error = %error_chain(error), "delivery failed");
            }
        }
    }
}

/// What the handler of `group` is given.
fn raw_delivery<'a>(
    lease: &'a Lease,
    group: &'a Group,
    attempt: u32,
    row: Option<&'a crate::columns::ModelRow>,
) -> RawDelivery<'a> {
    RawDelivery {
        category: group.info.identity.name,
        scope_name: group.info.identity.scope_name,
        shard: &lease.shard,
        message: &group.newest,
        attempt,
        fencing_token: lease.token,
        row,
    }
}

/// Calls `group`'s handler (reading its model's row first, for a replicated model), under the
/// handler timeout, with the lease kept alive beside it; a panic is a failed delivery.
async fn call_handler<S: ShardSession, St: Store>(
    session: &mut S,
    inner: &Inner<St>,
    lease: &Lease,
    since: &mut Instant,
    group: &Group,
    attempt: u32,
) -> Result<(), DeliveryError> {
    let loaded;
    let row = match (&group.info.model, &group.model_row) {
        (None, _) => None,
        // Read with the other drains' rows (see `Group::model_row`).
        (Some(_), Some(row)) => row.as_ref(),
        (Some(table), None) => {
            loaded = Box::pin(session.load_model(table, group.newest.object_identifier))
                .await
                .map_err(|source| DeliveryError::Lookup {
                    model: group.info.identity.name,
                    table: table.table,
                    object_identifier: group.newest.object_identifier,
                    source: Box::new(source),
                })?;
            loaded.as_ref()
        }
    };
    let mut cx = HandlerContext::new(session.handler_connection(), inner.registry.state());
    let call = group
        .info
        .handler
        .call(raw_delivery(lease, group, attempt, row), &mut cx);
    guarded(call, inner, lease, since, group).await?
}

/// Runs `call` (handlers, starting with `group`'s) with the lease (last set at `since`) kept
/// alive beside it, under the handler timeout: its output, or the timeout or panic as the
/// failure of `group`.
async fn guarded<F: Future, St: Store>(
    call: F,
    inner: &Inner<St>,
    lease: &Lease,
    since: &mut Instant,
    group: &Group,
) -> Result<F::Output, DeliveryError> {
    let config = &inner.config;
    let call = keeping_the_lease(AssertUnwindSafe(call).catch_unwind(), inner, lease, since);
    let outcome = match config.handler_timeout {
        Some(timeout) => {
            tokio::time::timeout(timeout, call)
                .await
                .map_err(|_| DeliveryError::TimedOut {
                    category: group.info.identity.name,
                    message_id: group.newest.id,
                    timeout,
                })?
        }
        None => call.await,
    };
    outcome.map_err(|panic| DeliveryError::Panicked {
        category: group.info.identity.name,
        message_id: group.newest.id,
        panic: panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_owned()),
    })
}

/// Runs `call` (a handler, or a held shard's wait for a handler's turn) while extending the
/// lease beside it, a third of the lease after it was last set (`since`, by this relay's
/// clock) and every third of the lease after each extension: a live relay keeps its shard
/// however long its handler takes (or its turn), and only a dead one loses it. The
/// extensions of all the shards the relay keeps at one moment go to the store together
/// ([`Store::extend_leases`]). In transaction mode the claiming transaction holds the
/// shard, and there is nothing to extend.
pub(super) async fn keeping_the_lease<F: Future, St: Store>(
    call: F,
    inner: &Inner<St>,
    lease: &Lease,
    since: &mut Instant,
) -> F::Output {
    let config = &inner.config;
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
    // Boxed: made only for a handler that waits, it keeps every drain's future small.
    let heartbeat = Box::pin(async {
        let mut next = *since + every;
        loop {
            tokio::time::sleep_until(next).await;
            let asked = Instant::now();
            let extended = inner
                .together
                .extend(&inner.store, lease, config.lease)
                .await;
            let waited = asked.elapsed();
            match extended {
                Ok(true) => {
                    debug!(shard = %lease.shard, waited_ms = waited.as_millis() as u64, "lease extended while a handler runs");
                    if asked + waited > *since + config.lease {
                        inner.lapsed(lease, *since, asked, waited);
                    }
                    *since = asked;
                    next = asked + every;
                }
                Ok(false) => {
                    inner.lapsed(lease, *since, asked, waited);
                    warn!(shard = %lease.shard, token = lease.token, waited_ms = waited.as_millis() as u64, set_ms_ago = since.elapsed().as_millis() as u64, "lease lost while a handler runs; another worker owns the shard");
                    return std::future::pending::<()>().await;
                }
                Err(error) => {
                    debug!(shard = %lease.shard, error = %error_chain(&error), "cannot extend the lease; trying again");
                    // Again soon: the lease runs out a whole lease after it was set.
                    next = Instant::now() + every / 4;
                }
            }
        }
    });
    tokio::select! {
        output = &mut call => output,
        () = heartbeat => unreachable!("the heartbeat never ends"),
    }
}
